"""Settings of the global router, one frozen dataclass validated at construction."""

import math
from dataclasses import dataclass, field

from radixmesh.cluster.policy.base import PolicyConfig, policy_names
from radixmesh.cluster.policy.pending_index import DEFAULT_MAX_HOLD_S
from radixmesh.cluster.router.admission import AdmissionLimits
from radixmesh.common.text.tokenizer import BYTE_VOCAB_SIZE
from radixmesh.proto.block_hash import MAX_KEY_BYTES
from radixmesh.proto.metadata.limits import MAX_HASHES_PER_QUERY
from radixmesh.proto.serve.limits import PromptLimits

DEFAULT_POLICY = "cost"
"""The routing policy unless one is chosen: the router's, the launcher's and the simulator's default."""
DEFAULT_LOCAL_PREFILL_MAX_TOKENS = 256
"""RouterConfig.local_prefill_max_tokens unless chosen: the router's, the launcher's and `up`'s default."""


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """How the router hashes, asks the metadata service, routes and retries."""

    layout: str
    """KV layout fingerprint of the agents behind this router; Match is asked for this partition."""
    block_size: int = 16
    """Tokens per block of that layout (the agents' engine block size)."""
    policy: str = DEFAULT_POLICY
    """Routing policy while the metadata service answers (see policy.base.policy_names())."""
    fallback_policy: str = "least_loaded"
    """Policy used while the metadata service is unreachable; it sees no prefixes."""
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)
    hash_key: bytes = b""
    """The cluster's block-hash key (empty: unkeyed); must equal the agents' key."""
    model_name: str = "radixmesh"
    """The model id served at /v1/models and expected in requests."""
    limits: PromptLimits = PromptLimits(vocab_size=BYTE_VOCAB_SIZE, max_context_tokens=4096)  # noqa: RUF009  (frozen)
    """What a prompt must satisfy: the agents' model's vocabulary and context length."""
    match_timeout_s: float = 0.5
    """Deadline of one Match call; past it the request is routed without prefixes."""
    metadata_retry_s: float = 1.0
    """After a failed Match, requests skip the metadata service this long before probing it again,
    so an outage does not add match_timeout_s to every request."""
    max_match_blocks: int = MAX_HASHES_PER_QUERY
    """Blocks of a prompt sent to Match at most (the service's per-query limit)."""
    index_replica: bool = True
    """Keep a replica of the global index in the router (WatchIndex) and route on it without a Match
    RPC while it is in sync; Match stays the fallback. False: Match on every request."""
    least_loaded_candidates: int = 4
    """Routing on the replica scores the prompt's prefix holders plus this many least-loaded nodes,
    so a decision's cost follows the holders, not the node count."""
    pending_ttl_s: float = 5.0
    """How long a routed request's blocks still count as speculatively held by its node after its
    first token came back (time for the node's cache events to reach the index). Before that they
    count as held while the request waits, however long its queue (up to pending_max_s)."""
    pending_max_s: float = DEFAULT_MAX_HOLD_S
    """Longest a routed request's blocks count as held while it has not answered: the bound for a
    request whose end the router never learns of."""
    default_prefill_tokens_per_s: float = 2000.0
    """Prefill rate assumed for a node that has not heartbeated a measured one."""
    stream_handoff: bool = True
    """In a split cluster, send the decode agent its request once the prefill agent has queued the
    prompt, so that its pull follows the prefill chunk by chunk (docs/disaggregation.md). False: only
    once the prefill has ended (the hand-off of issue 37's first slice, kept to compare with)."""
    local_prefill_max_tokens: int = DEFAULT_LOCAL_PREFILL_MAX_TOKENS
    """In a split cluster, a request whose prompt a decode agent already holds but for at most this many
    tokens is served there whole, with no hand-off (the next turn of a conversation that agent
    decoded; Dynamo's conditional disaggregation). 0: every request goes through a prefill agent."""
    max_attempts: int = 3
    """Nodes tried per request when agents become unavailable (the first try included)."""
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    """Requests served at once and waiting; past them requests are refused (HTTP 429)."""

    def __post_init__(self) -> None:
        names = policy_names()
        for which in (self.policy, self.fallback_policy):
            if which not in names:
                raise ValueError(f"unknown policy {which!r}; valid: {', '.join(names)}")
        if not self.layout:
            raise ValueError("layout fingerprint must be non-empty")
        positive = {
            "block_size": self.block_size,
            "max_match_blocks": self.max_match_blocks,
            "max_attempts": self.max_attempts,
            "least_loaded_candidates": self.least_loaded_candidates,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, seconds in (("match_timeout_s", self.match_timeout_s), ("pending_ttl_s", self.pending_ttl_s),
                              ("pending_max_s", self.pending_max_s)):
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {seconds}")
        if not (math.isfinite(self.metadata_retry_s) and self.metadata_retry_s >= 0):
            raise ValueError(f"metadata_retry_s must be a finite number >= 0, got {self.metadata_retry_s}")
        if not (math.isfinite(self.default_prefill_tokens_per_s) and self.default_prefill_tokens_per_s > 0):
            raise ValueError("default_prefill_tokens_per_s must be a finite number > 0")
        if len(self.hash_key) > MAX_KEY_BYTES:
            raise ValueError(f"hash key is at most {MAX_KEY_BYTES} bytes, got {len(self.hash_key)}")
        if not self.model_name:
            raise ValueError("model_name must be non-empty")
