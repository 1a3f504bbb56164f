"""What the router asks a node agent to do for one request, and what comes back.

The router decides; the agent executes: reuse its local prefix, pull the planned blocks from the named
peer (recomputing them on any failure), prefill the rest, decode. Streaming yields TokenDelta items
and ends with exactly one ServeResult.
"""

from dataclasses import dataclass

from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.sampling import FinishReason, SamplingParams, TokenLogprob
from radixmesh.proto.serve.tokens import TokenSources


@dataclass(frozen=True, slots=True)
class PullPlan:
    """Pull prompt blocks [first_block, first_block + num_blocks) from `peer` before prefill."""

    peer: NodeId
    address: str
    """The peer's transfer address, as it registered it: host:port (ucx) or ray:<actor name> (ray)."""
    first_block: int
    num_blocks: int
    follow: bool = False
    """The peer is computing these blocks now (a streamed hand-off, docs/disaggregation.md): pull
    them as they are computed, rather than only what it holds when the pull starts."""

    def __post_init__(self) -> None:
        if self.first_block < 0 or self.num_blocks < 1:
            raise ValueError(f"bad pull range: first_block={self.first_block}, num_blocks={self.num_blocks}")


@dataclass(frozen=True, slots=True)
class ServePlan:
    """One request: as the router takes it in (no pull; `sampling.seed` None: the router fixes one, so
    retries reproduce it) and, routed, as it sends it to the chosen node's agent."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    tenant: str = ""
    """Tenant name; the agent salts the block hashes with block_hash.tenant_salt(tenant)."""
    pull: PullPlan | None = None
    expected_local_blocks: int = 0
    """Blocks the router expected on the node itself, for index-precision accounting."""
    handoff: bool = False
    """The decode phase of a split request (docs/disaggregation.md): its prompt's hits were counted
    where it was prefilled, so the agent reports none for it to the metadata service (what it pulls
    is the hand-off, not a cache hit)."""
    prefill_only: bool = False
    """The prefill phase of a split request: compute and cache the prompt's KV, sample nothing. The
    agent answers Queued once the request is in its engine (from then on a peer may follow its
    blocks, PullPlan.follow), then a ServeResult without tokens (FinishReason.PREFILLED)."""


@dataclass(frozen=True, slots=True)
class Queued:
    """A prefill-only request is in the agent's engine: a peer may follow its blocks from now on."""

    request_id: str


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """New tokens of a streaming request, in order."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    """One per token when the request asked for log-probabilities (sampling.logprobs), else empty."""


@dataclass(frozen=True, slots=True)
class ServeStats:
    """Where a served request's prompt tokens came from and its timings."""

    tokens: TokenSources
    pull_bytes: int
    pull_seconds: float
    pull_failed: bool
    """The plan named a pull that delivered fewer blocks than planned (they were recomputed)."""
    ttft_s: float
    decode_s: float
    preemptions: int

    @property
    def prompt_tokens(self) -> int:
        return self.tokens.prompt


@dataclass(frozen=True, slots=True)
class ServeResult:
    """A finished request, as the agent reports it."""

    request_id: str
    node: NodeId
    output_token_ids: tuple[int, ...]
    finish_reason: FinishReason
    stats: ServeStats
    output_logprobs: tuple[TokenLogprob, ...] = ()
    """One per output token when the request asked for log-probabilities, else empty."""


ServeItem = Queued | TokenDelta | ServeResult
"""A prefill-only plan's stream starts with one Queued; every stream ends with one ServeResult."""
