"""`radixmesh demo`: a shared-prefix chat workload through a local 3-agent cluster's HTTP API, once
with prefix caching as deployed and once with caching defeated, side by side.

Workload: `chats` conversations of `turns` turns over a few long shared system prompts; each turn
sends the whole history (rendered by the chat template, so it is a growing shared prefix), `chats
_at_once` conversations at a time. The baseline runs the same requests with a distinct `cache_salt`
per request: the tenant salt makes every prefix unique, so nothing is reused and every prompt token is
prefilled, exactly the work of a cluster without a cache. Because of the salt neither half can profit
from what the other left behind, whichever runs first (`radixmesh demo --order`).
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import openai
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.sim.router_client import router_stats
from radixmesh.cluster.sim.simulator import percentile
from radixmesh.proto.serve.tokens import SOURCES

TOPICS = ("a distributed prefix cache", "paged attention", "consistent hashing with bounded loads",
          "RDMA transfers", "two-phase garbage collection", "continuous batching")


@dataclass(frozen=True, slots=True)
class DemoWorkload:
    chats: int = 6
    turns: int = 3
    systems: int = 3
    system_chars: int = 1200
    """Length of each shared system prompt (bytes = tokens with the byte tokenizer)."""
    max_tokens: int = 8
    chats_at_once: int = 4

    def __post_init__(self) -> None:
        if min(self.chats, self.turns, self.systems, self.system_chars, self.max_tokens, self.chats_at_once) < 1:
            raise ValueError("every workload size must be >= 1")

    @property
    def requests(self) -> int:
        return self.chats * self.turns

    def system_prompt(self, i: int) -> str:
        head = f"You are assistant {i} of the radixmesh demo. Answer in one short line. Rules: "
        rules = " ".join(f"({k}) be precise about {TOPICS[(i + k) % len(TOPICS)]}." for k in range(1000))
        return (head + rules)[: self.system_chars]


@dataclass(frozen=True, slots=True)
class DemoRun:
    """One pass of the workload, as the client and the router's /stats saw it."""

    label: str
    requests: int
    prompt_tokens: int
    hits_by_source: dict[str, int]
    ttfts_s: tuple[float, ...]
    bytes_pulled: int
    wall_s: float

    @property
    def hit_rate(self) -> float:
        return 1 - self.hits_by_source["computed"] / self.prompt_tokens if self.prompt_tokens else 0.0

    def ttft(self, q: float) -> float:
        return percentile(self.ttfts_s, q)


async def run_workload(base_url: str, model: str, workload: DemoWorkload, label: str, *, caching: bool,
                       on_done: Callable[[], None]) -> DemoRun:
    """Send the workload through the router's chat API; `caching` False salts every request uniquely."""
    before, pulled = await router_stats(base_url), await _bytes_pulled(base_url)
    ttfts: list[float] = []
    t0 = time.monotonic()
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="-", max_retries=0, timeout=300) as client:

        async def chat(c: int) -> None:
            history: list[ChatCompletionMessageParam] = [
                {"role": "system", "content": workload.system_prompt(c % workload.systems)}]
            for turn in range(workload.turns):
                history.append({"role": "user", "content": f"Chat {c}, question {turn}: what about "
                                                           f"{TOPICS[(c + turn) % len(TOPICS)]}?"})
                sent = time.monotonic()
                stream = await client.chat.completions.create(
                    model=model, messages=history, max_tokens=workload.max_tokens, temperature=0, stream=True,
                    extra_body=None if caching else {"cache_salt": f"{label}-{c}-{turn}"})
                reply, first = "", None
                async for chunk in stream:
                    first = first if first is not None else time.monotonic()
                    reply += (chunk.choices[0].delta.content or "") if chunk.choices else ""
                ttfts.append((first or time.monotonic()) - sent)
                history.append({"role": "assistant", "content": reply})
                on_done()

        for start in range(0, workload.chats, workload.chats_at_once):
            await asyncio.gather(*(chat(c) for c in range(start, min(start + workload.chats_at_once,
                                                                     workload.chats))))
    wall = time.monotonic() - t0
    after = await router_stats(base_url)
    return DemoRun(label, after["requests"] - before["requests"], after["prompt_tokens"] - before["prompt_tokens"],
                   {s: after[s] - before[s] for s in SOURCES}, tuple(ttfts),
                   await _bytes_pulled(base_url) - pulled, wall)


async def ask(base_url: str, model: str, question: str, max_tokens: int = 24) -> str:
    """One chat question through the router, answered greedily: what a user would see."""
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="-", max_retries=0, timeout=300) as client:
        answer = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}], max_tokens=max_tokens, temperature=0)
    return answer.choices[0].message.content or ""


async def _bytes_pulled(base_url: str) -> int:
    """The router's radixmesh_transfer_bytes_total (KV bytes its requests pulled between nodes)."""
    async with aiohttp.ClientSession() as http, http.get(f"{base_url}/metrics") as r:
        text = await r.text()
    return int(sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "radixmesh_transfer_bytes_total" and "node" not in s.labels))
