"""Log-probabilities in OpenAI's two JSON shapes: the legacy completions object (parallel lists)
and chat's list of token entries. A token's text is its own decoding (a byte of a multi-byte
character decodes to U+FFFD alone, as in vLLM)."""

from collections.abc import Sequence
from typing import Any

from radixmesh.common.text.tokenizer import Tokenizer
from radixmesh.proto.serve.sampling import TokenLogprob


def completion_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob], text_offset: int
                        ) -> dict[str, Any]:
    """{"tokens", "token_logprobs", "top_logprobs", "text_offset"}; offsets count from `text_offset`
    (the characters of the choice's earlier tokens)."""
    tokens = [tokenizer.decode([e.token_id]) for e in entries]
    offsets = []
    for text in tokens:
        offsets.append(text_offset)
        text_offset += len(text)
    top = []
    for e in entries:
        alternatives: dict[str, float] = {}
        for token_id, logprob in e.top:  # two ids may decode alike: the likelier one names the text
            alternatives.setdefault(tokenizer.decode([token_id]), logprob)
        top.append(alternatives)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries], "top_logprobs": top,
            "text_offset": offsets}


def chat_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(e.token_id, e.logprob), "top_logprobs": [entry(i, lp) for i, lp in e.top]}
                        for e in entries]}


def text_length(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> int:
    """Characters the tokens of `entries` take in completion_logprobs' offsets."""
    return sum(len(tokenizer.decode([e.token_id])) for e in entries)
