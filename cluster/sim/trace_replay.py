"""Trace replay through a running deployment's router: each trace request becomes a completion
of its mapped tokens, sent at its (sped-up) trace time, or one after another with `sequential`.

Hit rate by source is the difference of the router's /stats before and after (so only this
replay's traffic should run meanwhile); TTFT is measured here, to the first streamed chunk. The
oracle gap compares the achieved block hit rate with the infinite-cache bound of the same prompts.
A request admission control refuses (HTTP 429) is counted as refused, or, with `retry_refused`, sent
again after the Retry-After the router names; TTFT is of the requests served (from their last send).
"""

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import openai

from radixmesh.cluster.sim.oracle import infinite_bound
from radixmesh.cluster.sim.router_client import KEYLESS, ClientAccess, router_stats
from radixmesh.cluster.sim.simulator import percentile
from radixmesh.cluster.sim.trace import TokenMapping, TraceRequest
from radixmesh.proto.serve.tokens import SOURCES


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    block_size: int = 16
    """The deployment's tokens per block: each trace block maps to exactly one cluster block."""
    vocab_size: int = 256
    """Trace tokens are drawn from [0, vocab_size) (the byte tokenizer's bytes by default)."""
    max_prompt_blocks: int = 128
    """Longer trace prompts keep their first blocks (a prefix, so sharing is preserved)."""
    max_tokens: int = 4
    """Output tokens per request at most (the trace's output_length when smaller)."""
    sequential: bool = False
    """Send each request after the previous one finished, ignoring trace times."""
    model: str = "radixmesh"
    retry_refused: bool = False
    """A request refused with 429 is sent again after the response's Retry-After (else counted refused)."""
    max_retries: int = 10
    """Sends of one request after the first, at most, with `retry_refused`; then it counts as refused."""

    def __post_init__(self) -> None:
        if min(self.block_size, self.vocab_size, self.max_prompt_blocks, self.max_tokens) < 1:
            raise ValueError("block_size, vocab_size, max_prompt_blocks and max_tokens must be >= 1")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")

    @property
    def mapping(self) -> TokenMapping:
        return TokenMapping(tokens_per_block=self.block_size, vocab_size=self.vocab_size)


@dataclass(frozen=True, slots=True)
class ReplayReport:
    requests: int
    prompt_tokens: int
    hits_by_source: dict[str, int]
    """Prompt tokens by source, from the router's /stats."""
    hit_rate: float
    """Token-weighted (local + remote) / prompt tokens."""
    block_hit_rate: float
    """Hit tokens / block size over all prompt blocks: comparable to the simulator's hit rate."""
    infinite_bound: float
    ttft_p50_s: float
    ttft_p99_s: float
    wall_s: float
    refused: int = 0
    """Requests the router refused with HTTP 429 (after every retry, with retry_refused)."""
    retried: int = 0
    """Sends repeated after a 429 (with retry_refused)."""

    def as_dict(self) -> dict[str, object]:
        d = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        d["achieved_over_bound"] = self.block_hit_rate / self.infinite_bound if self.infinite_bound else 0.0
        return d


def fit(trace: Sequence[TraceRequest], config: ReplayConfig) -> list[TraceRequest]:
    """The requests as replayed: prompts cut to `max_prompt_blocks`, empty prompts dropped."""
    return [replace(r, hash_ids=r.hash_ids[: config.max_prompt_blocks]) for r in trace if r.hash_ids]


async def replay(base_url: str, trace: Sequence[TraceRequest], config: ReplayConfig,
                 on_done: Callable[[], None] | None = None, access: ClientAccess = KEYLESS) -> ReplayReport:
    """Replay `fit(trace)` against the router at `base_url` (reached with `access`); `on_done` is called
    per finished request (served or refused). Raises openai.APIError for any other error answer."""
    requests = fit(trace, config)
    mapping = config.mapping
    prompts = [mapping.tokens(r) for r in requests]
    before = await router_stats(base_url, access)
    ttfts: list[float] = []
    refused: list[TraceRequest] = []
    retried: list[TraceRequest] = []
    t0 = time.monotonic()
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=access.api_key or "-", max_retries=0, timeout=600,
                                  http_client=openai.DefaultAsyncHttpxClient(verify=access.ssl_context())) as client:

        async def one(r: TraceRequest, prompt: list[int]) -> None:
            if not config.sequential:
                await asyncio.sleep(max(0.0, t0 + r.arrival_s - time.monotonic()))  # the trace's own clock
            for attempt in range(config.max_retries + 1 if config.retry_refused else 1):
                sent = time.monotonic()
                try:
                    stream = await client.completions.create(
                        model=config.model, prompt=prompt, temperature=0,
                        max_tokens=max(1, min(config.max_tokens, r.output_length)), stream=True)
                    break
                except openai.RateLimitError as e:
                    if not config.retry_refused or attempt == config.max_retries:
                        refused.append(r)
                        if on_done is not None:
                            on_done()
                        return
                    retried.append(r)
                    await asyncio.sleep(_retry_after_s(e.response.headers.get("Retry-After")))
            first: float | None = None
            async for _ in stream:
                first = first if first is not None else time.monotonic()
            ttfts.append((first or time.monotonic()) - sent)
            if on_done is not None:
                on_done()

        if config.sequential:
            for r, p in zip(requests, prompts):
                await one(r, p)
        else:
            await asyncio.gather(*(one(r, p) for r, p in zip(requests, prompts)))
    wall = time.monotonic() - t0
    after = await router_stats(base_url, access)
    hits = {s: after[s] - before[s] for s in SOURCES}
    total = after["prompt_tokens"] - before["prompt_tokens"]
    blocks = sum(len(r.hash_ids) for r in requests)
    hashes = [mapping.hashes(r) for r in requests]
    return ReplayReport(
        requests=len(requests), prompt_tokens=total, hits_by_source=hits,
        hit_rate=(total - hits["computed"]) / total if total else 0.0,
        block_hit_rate=(total - hits["computed"]) / config.block_size / blocks if blocks else 0.0,
        infinite_bound=infinite_bound(hashes), ttft_p50_s=percentile(ttfts, 50), ttft_p99_s=percentile(ttfts, 99),
        wall_s=wall, refused=len(refused), retried=len(retried),
    )


def _retry_after_s(header: str | None) -> float:
    """Seconds a Retry-After header asks for (delta-seconds; 1 s when absent or a date)."""
    try:
        return max(0.0, float(header)) if header is not None else 1.0
    except ValueError:
        return 1.0
