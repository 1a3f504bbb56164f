"""Load through the router's OpenAI API with every answer checked against a cache-less engine, sent by
the package's load generator (radixmesh.cluster.bench: its Poisson arrivals and its one client).

Open loop: requests arrive on a fixed schedule (Poisson, seeded) whether or not earlier ones have
finished, as a fleet's clients do; each is a streamed greedy /v1/completions of token ids, so its TTFT
(to the first text), outcome, cached tokens and text are recorded. Prompts share a few long prefixes
(system prompts) with short distinct suffixes. The reference answer of every distinct prompt comes
from one engine of the same weights with prefix caching off, computed before the run. Used by
bench/chaos.py and bench/overload.py.
"""

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from radixmesh.cluster.bench.client import Reply, completion_body, stream_completion
from radixmesh.cluster.bench.schedule import poisson_times
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.source import ModelSource
from radixmesh.proto.serve.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class Workload:
    prefixes: int = 6
    prefix_tokens: int = 192
    suffix_tokens: int = 24
    distinct: int = 60
    """Distinct prompts (each prefix with distinct/prefixes suffixes); requests cycle through them."""
    max_tokens: int = 8
    seed: int = 0

    def prompts(self, vocab: int) -> list[tuple[int, ...]]:
        rng = random.Random(self.seed)
        heads = [[rng.randrange(3, vocab) for _ in range(self.prefix_tokens)] for _ in range(self.prefixes)]
        return [tuple(heads[i % self.prefixes] + [rng.randrange(3, vocab) for _ in range(self.suffix_tokens)])
                for i in range(self.distinct)]


@dataclass(frozen=True, slots=True)
class Outcome:
    at_s: float
    """Arrival, seconds after the run started."""
    status: int
    """HTTP status; 0 when the connection failed."""
    latency_s: float
    ttft_s: float | None
    correct: bool | None
    """Output equals the cache-less reference (None when there was no answer)."""
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class RunReport:
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, ok: Callable[[Outcome], bool]) -> int:
        return sum(1 for o in self.outcomes if ok(o))

    @property
    def succeeded(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200 and o.correct is not None]

    def hit_rate(self) -> float:
        done = self.succeeded
        prompt = sum(o.prompt_tokens for o in done)
        return sum(o.cached_tokens for o in done) / prompt if prompt else 0.0

    def quantile(self, what: str, q: float) -> float:
        values = sorted(v for o in self.succeeded if (v := getattr(o, what)) is not None)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q / 100 * len(values)))]

    def summary(self) -> dict[str, Any]:
        return {
            "sent": len(self.outcomes),
            "succeeded": len(self.succeeded),
            "refused": self.count(lambda o: o.status in (429, 503)),
            "failed": self.count(lambda o: o.status not in (200, 429, 503)),
            "wrong_tokens": self.count(lambda o: o.correct is False),
            "hit_rate": round(self.hit_rate(), 4),
            "ttft_p50_s": round(self.quantile("ttft_s", 50), 4),
            "ttft_p99_s": round(self.quantile("ttft_s", 99), 4),
            "latency_p50_s": round(self.quantile("latency_s", 50), 4),
            "latency_p99_s": round(self.quantile("latency_s", 99), 4),
        }


def references(source: ModelSource, prompts: list[tuple[int, ...]], max_tokens: int, block_size: int) -> list[str]:
    """Each prompt's greedy answer text from one cache-less engine of the same weights."""
    engine = Engine(source.load(), EngineConfig(block_size=block_size, model_id=source.identity(),
                                                memory=MemoryConfig(num_gpu_blocks=4096, enable_prefix_caching=False)))
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    outs = engine.generate([Request(RequestId(f"ref-{i}"), p, sampling) for i, p in enumerate(prompts)])
    tokenizer = source.tokenizer()
    return [tokenizer.decode(list(o.output_token_ids)) for o in outs]


async def one_request(session: aiohttp.ClientSession, url: str, body: dict[str, Any], expected: str,
                      started: float) -> Outcome:
    return checked(await stream_completion(session, url, body, time.monotonic), expected, started)


def checked(reply: Reply, expected: str, started: float) -> Outcome:
    """`reply` as an Outcome: answered only when its stream ran to its usage, right when its text is
    `expected`."""
    at = reply.sent_s - started
    done = reply.end_s if reply.end_s is not None else time.monotonic()
    if reply.status != 200 or reply.error is not None or not reply.usage:
        # no usage: the stream broke off before its end (an error chunk, a lost connection)
        return Outcome(at, reply.status if reply.status != 200 else 0, done - reply.sent_s, None, None)
    first = reply.text_s[0] if reply.text_s else done
    usage = reply.usage
    return Outcome(at, 200, done - reply.sent_s, first - reply.sent_s, "".join(reply.text) == expected,
                   usage["prompt_tokens"], usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))


async def warm_up(base_url: str, model: str, prompts: list[tuple[int, ...]], expected: list[str], *,
                  max_tokens: int, api_key: str = "") -> RunReport:
    """Each distinct prompt once, one after another: the caches hold every prefix before a measured run."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    report = RunReport()
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=120)) as session:
        started = time.monotonic()
        for prompt, want in zip(prompts, expected, strict=True):
            body = completion_body(model, prompt, max_tokens)
            report.outcomes.append(await one_request(session, f"{base_url}/v1/completions", body, want, started))
    return report


async def closed_loop(base_url: str, model: str, prompts: list[tuple[int, ...]], expected: list[str], *,
                      clients: int, duration_s: float, max_tokens: int, api_key: str = "") -> RunReport:
    """`clients` clients each sending its next request when the last one ends, for `duration_s`:
    what the cluster completes per second at that concurrency, without a flood of refusals."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    report = RunReport()
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=120),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.monotonic()

        async def client(c: int) -> None:
            i = c
            while time.monotonic() - started < duration_s:
                k = i % len(prompts)
                body = completion_body(model, prompts[k], max_tokens)
                report.outcomes.append(await one_request(session, f"{base_url}/v1/completions", body, expected[k],
                                                         started))
                i += clients

        await asyncio.gather(*(client(c) for c in range(clients)))
    return report


async def open_loop(base_url: str, model: str, prompts: list[tuple[int, ...]], expected: list[str], *, rate: float,
                    duration_s: float, max_tokens: int, seed: int = 0, api_key: str = "",
                    during: Callable[[float], Awaitable[None]] | None = None) -> RunReport:
    """Poisson arrivals at `rate` per second for `duration_s`; `during(t)` runs alongside (fault
    schedules). Waits for every request to end."""
    arrivals = poisson_times(rate, random.Random(seed))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    report = RunReport()
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.monotonic()
        side = asyncio.ensure_future(during(started)) if during is not None else None
        tasks: list[asyncio.Future[Outcome]] = []
        for i, t in enumerate(arrivals):
            if t >= duration_s:
                break
            await asyncio.sleep(max(0.0, started + t - time.monotonic()))  # the arrival schedule itself
            k = i % len(prompts)
            body = completion_body(model, prompts[k], max_tokens)
            tasks.append(asyncio.ensure_future(one_request(session, f"{base_url}/v1/completions", body,
                                                           expected[k], started)))
        report.outcomes = list(await asyncio.gather(*tasks))
        if side is not None:
            await side
    return report
