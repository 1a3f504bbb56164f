"""A prompt's text turned into token ids for the HTTP handlers: bounded before, and off the event loop.

Tokenizing (and rendering a chat template) costs time linear in the text, and a 4 MiB body took
seconds: on the event loop that stalls every other request, probes included. So a text longer than
the model's context could ever hold is refused before any work (one comparison), and what remains
is rendered and tokenized in a worker thread (asyncio.to_thread) while the loop serves the rest.
"""

import asyncio
from collections.abc import Sequence

from radixmesh.cluster.api.openai_schema import ApiError
from radixmesh.common.text.chat_template import ChatMessage, ChatTemplate
from radixmesh.common.text.tokenizer import Tokenizer
from radixmesh.proto.serve.limits import PromptLimits

MAX_CHARS_PER_TOKEN = 32
"""Characters one token may stand for, at most, in a prompt that fits the context. Prose and code
average 3-5 characters a token and the longest tokens of common vocabularies (runs of spaces or
dashes) rarely pass 32; the byte tokenizer's tokens are at most one character. A text longer than
this times the context length cannot fit, so it is refused before it is tokenized."""


def max_prompt_chars(limits: PromptLimits) -> int:
    return MAX_CHARS_PER_TOKEN * limits.max_context_tokens


def check_prompt_chars(chars: int, limits: PromptLimits, param: str) -> None:
    """ApiError(400, context_length_exceeded) for a text of `chars` characters that cannot fit."""
    bound = max_prompt_chars(limits)
    if chars > bound:
        raise ApiError(400, f"the {param} is {chars} characters: more than the {bound} that a context of "
                            f"{limits.max_context_tokens} tokens can hold ({MAX_CHARS_PER_TOKEN} characters a "
                            "token at most), so it was not tokenized", param=param, code="context_length_exceeded")


async def text_tokens(tokenizer: Tokenizer, limits: PromptLimits, text: str, param: str = "prompt"
                      ) -> tuple[int, ...]:
    """`text` tokenized by `tokenizer`, in a worker thread; ApiError(400) first when it is too long."""
    check_prompt_chars(len(text), limits, param)
    return tuple(await asyncio.to_thread(tokenizer.encode, text))


async def chat_tokens(tokenizer: Tokenizer, template: ChatTemplate, limits: PromptLimits,
                      messages: Sequence[ChatMessage]) -> tuple[int, ...]:
    """The prompt of `messages` rendered by `template` and tokenized, both in a worker thread.
    ApiError(400): contents too long (checked before rendering), a rendered prompt too long (a
    template adds text per message), or a conversation the template refuses."""
    check_prompt_chars(sum(len(m.content) for m in messages), limits, "messages")

    def render_and_encode() -> tuple[int, ...]:
        try:
            prompt = template.render(messages)
        except ValueError as e:  # the model's template refused the conversation
            raise ApiError(400, str(e), param="messages", code="invalid_messages") from e
        check_prompt_chars(len(prompt), limits, "messages")
        return tuple(tokenizer.encode(prompt))

    return await asyncio.to_thread(render_and_encode)
