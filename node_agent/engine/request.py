"""What a caller submits to the engine (request, sampling parameters) and what it gets back."""

from dataclasses import dataclass
from typing import NewType

import torch

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


@dataclass(eq=False, slots=True)
class PendingPrefix:
    """Prompt blocks the caller pulls from a peer while its request waits in the engine's queue.

    The caller sets `end_block`; Engine.submit (on the engine thread) fills in the rest, skipping
    what this node holds already, and allocates one pool block per block to pull::

        prompt blocks  [0, start)  | [start, start + len(block_ids))  | [.., end_block)
                       cached here | pulled into block_ids (in order) | no room: computed

    `block_ids` are named by no block table and no prefix cache until they land, so no step reads
    them and the caller may write their KV off the engine thread. The request is not admitted
    before Engine.land_pull says how many of them arrived; the engine frees the rest then (also
    when the request was aborted meanwhile: a block the transfer may still write is never freed
    before). Empty `block_ids`: nothing to pull (all cached here, or no room), and nothing to land.
    """

    end_block: int
    start: int = 0
    block_ids: tuple[BlockId, ...] = ()
    hashes: tuple[BlockHash, ...] = ()
    """The chained hashes of prompt blocks [start, end_block): what to ask the peer for."""
    parent: BlockHash | None = None
    """The hash of prompt block start - 1 (None when start is 0)."""


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
