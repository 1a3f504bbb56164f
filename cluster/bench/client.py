"""One streamed completion through the router's OpenAI API, timed at the client.

Times come from the injected clock: TTFT is sending to the first streamed choice, inter-token
gaps are between consecutive chunks that carry text, end to end runs to the last chunk.
"""

import asyncio
import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from radixmesh.cluster.bench.schedule import BenchRequest


class Outcome(enum.StrEnum):
    OK = "ok"
    REFUSED = "refused"
    """HTTP 429 from admission control (before or, rarely, after the stream started)."""
    FAILED = "failed"
    """Any other HTTP error, a broken stream, a connection error."""
    UNFINISHED = "unfinished"
    """Still running when the cell's drain time ran out (or the bench was stopped)."""


@dataclass(frozen=True, slots=True)
class RequestResult:
    index: int
    outcome: Outcome
    ttft_s: float | None = None
    gaps_s: tuple[float, ...] = ()
    """Inter-token gaps: between consecutive chunks that carried text."""
    e2e_s: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens the router reports reused (usage.prompt_tokens_details.cached_tokens)."""
    ttft_censored: bool = False
    """An unfinished request without a first token: ttft_s is how long it had waited, a lower bound."""
    detail: str = ""

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for a one-token reply)."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return 0.0
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


async def complete(http: aiohttp.ClientSession, base_url: str, model: str, request: BenchRequest,
                   clock: Callable[[], float], salt: str | None = None) -> RequestResult:
    """Send `request` as a streamed completion (ignore_eos, so exactly max_tokens come back) and time it.
    `salt` is sent as cache_salt (the request then shares no prefix with any other). Never raises for
    what the router or the network does: that is the result's outcome. Cancelled (the cell's drain
    ran out), it returns an UNFINISHED result with its TTFT, or its wait so far as a lower bound."""
    body: dict[str, Any] = {"model": model, "prompt": list(request.prompt), "max_tokens": request.max_tokens,
                            "temperature": 0, "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}}
    if salt is not None:
        body["cache_salt"] = salt
    sent = clock()
    first: float | None = None
    last_text: float | None = None
    gaps: list[float] = []
    usage: dict[str, Any] = {}
    try:
        async with http.post(f"{base_url}/v1/completions", json=body) as response:
            if response.status != 200:
                outcome = Outcome.REFUSED if response.status == 429 else Outcome.FAILED
                return RequestResult(request.index, outcome, detail=f"HTTP {response.status}")
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:  # the stream started, then the router gave up on the request
                    error = chunk["error"]
                    refused = error.get("code") == "rate_limit_exceeded" or error.get("type") == "requests"
                    return RequestResult(request.index, Outcome.REFUSED if refused else Outcome.FAILED,
                                         detail=str(error.get("message", error)))
                now = clock()
                usage = chunk.get("usage") or usage
                choices = chunk.get("choices") or []
                if not choices:
                    continue
                first = now if first is None else first
                if choices[0].get("text"):
                    if last_text is not None:
                        gaps.append(now - last_text)
                    last_text = now
    except (aiohttp.ClientError, OSError, json.JSONDecodeError) as e:
        return RequestResult(request.index, Outcome.FAILED, detail=f"{type(e).__name__}: {e}")
    except asyncio.CancelledError:  # the runner's own cancel: what this request saw is still a figure
        waited = (first if first is not None else clock()) - sent
        return RequestResult(request.index, Outcome.UNFINISHED, waited, ttft_censored=first is None,
                             detail="cancelled at the end of the cell")
    end = clock()
    if first is None:
        return RequestResult(request.index, Outcome.FAILED, detail="the stream ended without a token")
    details = usage.get("prompt_tokens_details") or {}
    return RequestResult(request.index, Outcome.OK, first - sent, tuple(gaps), end - sent,
                         int(usage.get("completion_tokens", request.max_tokens)),
                         int(details.get("cached_tokens", 0)))
