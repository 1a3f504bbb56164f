"""What a caller submits to the engine (request, sampling parameters) and what it gets back."""

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

import torch

from radixmesh.node_agent.block_hash import BlockHash
from radixmesh.node_agent.ids import BlockId

RequestId = NewType("RequestId", str)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token, and when to stop."""

    max_tokens: int = 16
    """Tokens to generate at most (>= 1)."""
    temperature: float = 0.0
    """0 is greedy (argmax); otherwise logits are divided by it before softmax."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p, in (0, 1]."""
    seed: int | None = None
    """Seeds this request's sampling; token i uses (seed, i), so preemption never changes the draw.
    None: the engine draws one from its injected random source at submit."""
    stop_token_ids: tuple[int, ...] = ()
    """Stop after generating any of these (the stop token is kept in the output)."""
    ignore_eos: bool = False
    """Keep generating past the model's EOS token (benchmarks want fixed lengths)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


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
    sampling: SamplingParams = SamplingParams()
    salt: bytes = b""
    """Tenant salt of the block hashes (block_hash.tenant_salt); tenants share only equal salts."""
    external_prefix: ExternalPrefix | None = None


class FinishReason(StrEnum):
    LENGTH = "length"
    STOP = "stop"


@dataclass(slots=True)
class RequestStats:
    """Where a request's tokens came from and how long it took (times from the engine's clock).

    Token counts are summed over admissions: a request recomputed after preemption counts again.
    """

    prompt_tokens: int
    arrival_s: float
    cached_gpu_tokens: int = 0
    cached_host_tokens: int = 0
    cached_external_tokens: int = 0
    computed_tokens: int = 0
    preemptions: int = 0
    first_token_s: float | None = None
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
