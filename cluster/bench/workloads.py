"""The bench's workloads: five seeded generators and the Mooncake traces, as sessions of turns.

Prompts are token ids from [0, vocab) (the byte tokenizer's by default), so block sharing is exact
at any block size; a resent history holds the generator's replies, the same for every arm.

    chat    users with think times of seconds to minutes; a few shared system prompts; each turn
            resends the conversation so far (system | user 1 | reply 1 | ... | user k)
    convo   chat with no system prompt: nothing is shared between users, only each user's own
            conversation (like Mooncake's conversation trace; a hash-affinity router's best case)
    docs    long shared documents, popular ones asked more (Zipf); short questions, several per
            user (document | question)
    agent   a long tool preamble shared per toolset; a task; many short calls a second or so apart,
            each resending the run so far (preamble | task | call 1 | result 1 | ... )
    long    one request per user: a short shared instruction and a long document of its own, 2k-8k
            tokens in all, 64-256 output tokens (instruction | document)
    trace   a Mooncake JSONL file in file order, one request per session; its hash ids mapped to
            tokens one trace block per cluster block (its timestamps give way to the offered rate)
"""

import dataclasses
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from radixmesh.cluster.bench.schedule import Turn, Workload, random_tokens
from radixmesh.cluster.sim.trace import TokenMapping, iter_trace

VOCAB = 256
"""Token ids of generated prompts: the byte tokenizer's bytes, ids every model accepts."""


def _span(rng: random.Random, bounds: tuple[int, int], scale: float) -> int:
    """A length drawn uniformly from `bounds`, times `scale` (at least 1)."""
    return max(1, round(rng.randint(*bounds) * scale))


def _think(rng: random.Random, median_s: float, bounds: tuple[float, float]) -> float:
    """A think time: log-normal around `median_s` (most within 3x either way), clipped to `bounds`."""
    return min(bounds[1], max(bounds[0], rng.lognormvariate(math.log(median_s), 1.0)))


@dataclass(frozen=True, slots=True)
class ChatWorkload:
    """Multi-turn chat. Token lengths are multiplied by `scale`."""

    systems: int = 3
    """Shared system prompts, one per conversation drawn uniformly; 0: conversations start bare."""
    system_tokens: int = 512
    user_tokens: tuple[int, int] = (16, 64)
    reply_tokens: tuple[int, int] = (32, 96)
    """Length of each assistant reply as it reappears in the next turn's history."""
    turns: tuple[int, int] = (2, 6)
    think_median_s: float = 20.0
    think_bounds_s: tuple[float, float] = (2.0, 180.0)
    max_tokens: int = 8
    max_prompt_tokens: int = 2000
    """A conversation ends before a turn would pass this (the model's context is the hard bound)."""
    scale: float = 1.0
    vocab: int = VOCAB
    name: str = "chat"

    def __post_init__(self) -> None:
        # Sessions whose first turn does not fit are skipped: if none can fit, `sessions` would spin forever.
        shortest = ((max(1, round(self.system_tokens * self.scale)) if self.systems else 0)
                    + max(1, round(self.user_tokens[0] * self.scale)) + self.max_tokens)
        if shortest > self.max_prompt_tokens:
            raise ValueError(f"the shortest first turn ({shortest} tokens with the system prompt and max_tokens) "
                             f"passes max_prompt_tokens {self.max_prompt_tokens}")

    def sessions(self, rng: random.Random) -> Iterator[Sequence[Turn]]:
        systems = [random_tokens(rng, max(1, round(self.system_tokens * self.scale)), self.vocab)
                   for _ in range(self.systems)]
        while True:
            history = systems[rng.randrange(self.systems)] if systems else ()
            turns: list[Turn] = []
            for k in range(rng.randint(*self.turns)):
                if k:
                    history += random_tokens(rng, _span(rng, self.reply_tokens, self.scale), self.vocab)
                history += random_tokens(rng, _span(rng, self.user_tokens, self.scale), self.vocab)
                if len(history) + self.max_tokens > self.max_prompt_tokens:
                    break
                think = _think(rng, self.think_median_s, self.think_bounds_s) if k else 0.0
                turns.append(Turn(history, self.max_tokens, think))
            if turns:
                yield turns


@dataclass(frozen=True, slots=True)
class ConvoWorkload(ChatWorkload):
    """Chat without a shared system prompt: users share nothing, each resends only its own conversation."""

    systems: int = 0
    name: str = "convo"


@dataclass(frozen=True, slots=True)
class DocsWorkload:
    """Question answering over many long documents. Token lengths are multiplied by `scale`."""

    documents: int = 8
    document_tokens: int = 1536
    zipf_s: float = 1.0
    """Popularity: document i is asked with weight 1 / (i + 1) ** zipf_s."""
    question_tokens: tuple[int, int] = (8, 32)
    questions: tuple[int, int] = (1, 4)
    think_median_s: float = 15.0
    think_bounds_s: tuple[float, float] = (2.0, 120.0)
    max_tokens: int = 8
    scale: float = 1.0
    vocab: int = VOCAB
    name: str = "docs"

    def sessions(self, rng: random.Random) -> Iterator[Sequence[Turn]]:
        docs = [random_tokens(rng, max(1, round(self.document_tokens * self.scale)), self.vocab)
                for _ in range(self.documents)]
        weights = [1 / (i + 1) ** self.zipf_s for i in range(self.documents)]
        while True:
            doc = rng.choices(docs, weights)[0]
            yield [Turn(doc + random_tokens(rng, _span(rng, self.question_tokens, self.scale), self.vocab),
                        self.max_tokens, _think(rng, self.think_median_s, self.think_bounds_s) if k else 0.0)
                   for k in range(rng.randint(*self.questions))]


@dataclass(frozen=True, slots=True)
class AgentWorkload:
    """Agent runs: a long tool preamble, many short calls. Token lengths are multiplied by `scale`."""

    toolsets: int = 2
    preamble_tokens: int = 1536
    task_tokens: tuple[int, int] = (32, 96)
    calls: tuple[int, int] = (4, 12)
    call_tokens: tuple[int, int] = (8, 24)
    """The assistant's tool call as it reappears in the next prompt."""
    result_tokens: tuple[int, int] = (16, 96)
    tool_median_s: float = 1.0
    """Time a tool takes between two calls of a run."""
    tool_bounds_s: tuple[float, float] = (0.1, 10.0)
    max_tokens: int = 8
    max_prompt_tokens: int = 2000
    scale: float = 1.0
    vocab: int = VOCAB
    name: str = "agent"

    def sessions(self, rng: random.Random) -> Iterator[Sequence[Turn]]:
        preambles = [random_tokens(rng, max(1, round(self.preamble_tokens * self.scale)), self.vocab)
                     for _ in range(self.toolsets)]
        while True:
            run = preambles[rng.randrange(self.toolsets)]
            run += random_tokens(rng, _span(rng, self.task_tokens, self.scale), self.vocab)
            turns = [Turn(run, self.max_tokens)]
            for _ in range(rng.randint(*self.calls) - 1):
                run += random_tokens(rng, _span(rng, self.call_tokens, self.scale), self.vocab)
                run += random_tokens(rng, _span(rng, self.result_tokens, self.scale), self.vocab)
                if len(run) + self.max_tokens > self.max_prompt_tokens:
                    break
                turns.append(Turn(run, self.max_tokens, _think(rng, self.tool_median_s, self.tool_bounds_s)))
            yield turns


@dataclass(frozen=True, slots=True)
class LongWorkload:
    """Long prompts, long answers (issue 37's goal workload: summaries, RAG over retrieved text). Prompt
    lengths are multiplied by `scale`, output lengths are not.

    Most of each prompt is computed: the workload measures what a long prefill does to the decodes
    beside it, which shared documents (`docs`) hide behind the cache. The one shared part is the
    instruction a service puts before every request; the document is the user's own.
    """

    instructions: int = 4
    """Shared instructions, one per request drawn uniformly."""
    instruction_tokens: int = 256
    prompt_tokens: tuple[int, int] = (2048, 8192)
    """Whole prompt (instruction and document), drawn uniformly."""
    output_tokens: tuple[int, int] = (64, 256)
    """Output tokens, drawn uniformly, then capped at `max_tokens`."""
    max_tokens: int = 256
    """Output tokens at most (`radixmesh bench --max-tokens` sets it; the range's top by default)."""
    max_prompt_tokens: int = 8192
    """Prompt and output stay within this (the model's context: 8,192 for SmolLM2 and Llama 3 8B); a
    longer document is cut at its end."""
    scale: float = 1.0
    vocab: int = VOCAB
    name: str = "long"

    def __post_init__(self) -> None:
        # Every draw fits: the instruction, one document token and the longest output (a document is cut).
        needed = max(1, round(self.instruction_tokens * self.scale)) + 1 + min(self.max_tokens, self.output_tokens[1])
        if self.prompt_tokens[0] > self.prompt_tokens[1] or not 1 <= self.output_tokens[0] <= self.output_tokens[1]:
            raise ValueError(f"ranges go low to high from >= 1: prompt_tokens {self.prompt_tokens}, "
                             f"output_tokens {self.output_tokens}")
        if self.instructions < 1 or self.max_tokens < 1:
            raise ValueError(f"instructions and max_tokens must be >= 1, got {self.instructions} and {self.max_tokens}")
        if needed > self.max_prompt_tokens:
            raise ValueError(f"an instruction ({self.instruction_tokens} tokens, scaled), one document token and the "
                             f"longest output ({needed} in all) must fit max_prompt_tokens {self.max_prompt_tokens}")

    def sessions(self, rng: random.Random) -> Iterator[Sequence[Turn]]:
        instructions = [random_tokens(rng, max(1, round(self.instruction_tokens * self.scale)), self.vocab)
                        for _ in range(self.instructions)]
        while True:
            instruction = instructions[rng.randrange(self.instructions)]
            output = min(self.max_tokens, rng.randint(*self.output_tokens))
            #   [0, len(instruction))  shared | [len(instruction), length)  this user's document
            length = min(_span(rng, self.prompt_tokens, self.scale), self.max_prompt_tokens - output)
            document = random_tokens(rng, max(1, length - len(instruction)), self.vocab)
            yield [Turn(instruction + document, output)]


@dataclass(frozen=True, slots=True)
class TraceWorkload:
    """A Mooncake trace's prompts in file order; one trace block = one cluster block of `block_size`."""

    path: Path
    block_size: int
    max_prompt_blocks: int = 64
    """Longer prompts keep their first blocks (a prefix, so sharing is preserved)."""
    max_tokens: int = 8
    """Output tokens at most (the trace's output_length when smaller)."""
    vocab: int = VOCAB
    name: str = "trace"

    def sessions(self, rng: random.Random) -> Iterator[Sequence[Turn]]:
        """The trace itself: `rng` is not drawn from."""
        mapping = TokenMapping(tokens_per_block=self.block_size, vocab_size=self.vocab)
        for r in iter_trace(self.path):
            blocks = r.hash_ids[: self.max_prompt_blocks]
            if blocks:
                prompt = tuple(mapping.tokens(replace(r, hash_ids=blocks)))
                yield [Turn(prompt, max(1, min(self.max_tokens, r.output_length)))]


GENERATORS: dict[str, type[ChatWorkload] | type[DocsWorkload] | type[AgentWorkload] | type[LongWorkload]] = {
    "chat": ChatWorkload, "convo": ConvoWorkload, "docs": DocsWorkload, "agent": AgentWorkload, "long": LongWorkload}
"""The seeded generators by name (`trace` needs a file, so it is built apart)."""


def workload_settings(workload: Workload) -> dict[str, object]:
    """The workload's fields, for the results JSON."""
    return {f.name: str(v) if isinstance(v, Path) else v
            for f in dataclasses.fields(workload) for v in (getattr(workload, f.name),)}  # type: ignore[arg-type]
