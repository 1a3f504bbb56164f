"""What a caller submits to the engine (request, sampling parameters), the engine's record of it while
it runs (SequenceState), and what it gets back."""

from dataclasses import dataclass, field
from typing import NewType

import torch

from radixmesh.common.prefix_cache.block_table import BlockTable
from radixmesh.common.text.stop_strings import StopText
from radixmesh.node_agent.memory.sequence import PendingPrefix
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import BlockId
from radixmesh.proto.serve.sampling import FinishReason, SamplingParams, TokenLogprob
from radixmesh.proto.serve.tokens import TokenSources

RequestId = NewType("RequestId", str)


@dataclass(frozen=True, slots=True)
class ExternalPrefix:
    """KV blocks someone (the transfer plane) already wrote into this node's gpu pool for a prompt.

    `hashes[i]` is the chained hash of block `block_ids[i]`; the hashes must be a contiguous run of
    the prompt's own block hashes. The caller holds one reference on each block; once the engine
    accepts the request, that reference is the engine's (it adopts the blocks, inserting them into
    the prefix cache, or frees them when they turn out not to be needed). A refused request leaves
    the reference with the caller.
    """

    block_ids: tuple[BlockId, ...]
    hashes: tuple[BlockHash, ...]

    def __post_init__(self) -> None:
        if len(self.block_ids) != len(self.hashes):
            raise ValueError(f"{len(self.block_ids)} block ids but {len(self.hashes)} hashes")


@dataclass(frozen=True, slots=True)
class Request:
    """One generation request in token ids (tokenizing is the caller's business)."""

    request_id: RequestId
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = SamplingParams()  # noqa: RUF009  (frozen, so one shared default is safe)
    salt: bytes = b""
    """Tenant salt of the block hashes (block_hash.tenant_salt); tenants share only equal salts."""
    external_prefix: ExternalPrefix | None = None
    prompt_hashes: tuple[BlockHash, ...] | None = None
    """The chained hashes of every full block of the prompt under `salt` and the engine's hash key
    (block_hash.hash_blocks), when the caller has them: the agent hashes each prompt once as it takes
    it and the engine's block table starts from these. Taken on trust (a wrong hash would cache KV
    under it); only their number is checked. None: the engine hashes the prompt itself."""
    pending_prefix: PendingPrefix | None = None
    """Blocks to be pulled while the request is queued (at most one of this and external_prefix)."""
    prefill_only: bool = False
    """Compute the prompt's KV (its full blocks cached as they are computed) and finish, PREFILLED,
    without sampling a token: the prefill phase of a split request (docs/disaggregation.md)."""


@dataclass(slots=True)
class RequestStats:
    """Where a request's prompt came from, the work it cost and how long it took (times from the
    engine's clock)."""

    prompt_tokens: int
    arrival_s: float
    sources: TokenSources | None = None
    """Where the prompt's tokens came from at the request's first admission (None before it). A
    re-admission after preemption recovers the request's own blocks: that is not a prompt source."""
    forward_tokens: int = 0
    """Tokens run through the model for this request: prefill, recomputation and decode."""
    preemptions: int = 0
    scheduled_s: float | None = None
    """When the request was first scheduled (a re-admission after preemption keeps it)."""
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def decode_s(self) -> float | None:
        if self.first_token_s is None or self.finish_s is None:
            return None
        return self.finish_s - self.first_token_s


@dataclass(slots=True, eq=False)
class SequenceState:
    """The engine's mutable record of one request between submit and finish.

    Token ranges: ``tokens[:num_computed]`` have K/V in ``block_ids`` (gpu), the rest are still to be
    computed. The block table is `table` (block_table.SequenceManager places it); the sequence
    holds exactly one reference on each block of ``block_ids`` and, while swapped out, on each of
    ``host_block_ids``.
    """

    request: Request
    seed: int
    stats: RequestStats
    table: BlockTable
    """Tokens (prompt, then sampled), gpu block table, block hashes and how many are committed."""
    num_computed: int = 0
    host_block_ids: list[BlockId] = field(default_factory=list)
    pulling: PendingPrefix | None = None
    """The pull this sequence waits for: it is not admitted before the pull lands (Engine.land_pull)."""
    external_hashes: frozenset[BlockHash] = frozenset()
    """Hashes handed in through Request.external_prefix (stats attribute their hits to "external")."""
    logits: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """One per output token when the request asked for log-probabilities."""
    stop_text: StopText | None = None
    """The decoded output, for requests with stop strings."""

    @property
    def tokens(self) -> list[int]:
        return self.table.tokens

    @property
    def block_ids(self) -> list[BlockId]:
        """The gpu block table (read-only use: NodeMemory changes it through SequenceManager)."""
        return self.table.block_table

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def output_token_ids(self) -> list[int]:
        return self.tokens[len(self.request.prompt_token_ids):]

    @property
    def is_swapped(self) -> bool:
        return bool(self.host_block_ids)


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """A finished request. `logits` holds the float32 logits of every generated token when the
    engine was built with keep_logits=True (exactness tests), else None."""

    request_id: RequestId
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    finish_reason: FinishReason
    stats: RequestStats
    logits: tuple[torch.Tensor, ...] | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    """One per output token when sampling.logprobs was set, else empty."""
