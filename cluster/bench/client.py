"""One streamed completion through the router's OpenAI API, timed at the client: the one client of
every load this repository generates (`radixmesh bench`, and bench/'s scripts).

`stream_completion` sends a body and records what came back (`Reply`); `complete` sends a bench
request and reads the reply as the bench measures it. Times come from the injected clock: TTFT is
sending to the first streamed choice, inter-token gaps are between consecutive chunks that carry
text, end to end runs to the last chunk.
"""

import asyncio
import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field
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


def completion_body(model: str, prompt: tuple[int, ...], max_tokens: int) -> dict[str, Any]:
    """A streamed greedy completion of token ids that generates exactly `max_tokens` (ignore_eos), with
    the usage (prompt and cached tokens) in its last chunk."""
    return {"model": model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


@dataclass(slots=True)
class Reply:
    """What one streamed completion brought back, as it came; times are the clock's."""

    sent_s: float
    status: int = 0
    """HTTP status; 0 when no answer came (connection error, broken stream)."""
    first_choice_s: float | None = None
    """When the first chunk with a choice arrived (its text may still be empty: a cut character)."""
    text_s: list[float] = field(default_factory=list)
    """When each chunk whose choice carried text arrived."""
    text: list[str] = field(default_factory=list)
    """The text of those chunks."""
    usage: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    """The error chunk that ended a stream after it started."""
    done: bool = False
    """The stream ran to its end ([DONE], or the last byte)."""
    cancelled: bool = False
    """Cancelled by the caller before it ended."""
    end_s: float | None = None
    """When it ended; None when cancelled."""
    detail: str = ""
    """Why no answer came (the exception)."""


async def stream_completion(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                            clock: Callable[[], float]) -> Reply:
    """POST `body` (stream: true) to `url` and record the reply. Never raises for what the router or the
    network does. Cancelled, it returns what arrived so far (`cancelled`)."""
    reply = Reply(clock())
    try:
        async with http.post(url, json=body) as response:
            reply.status = response.status
            if response.status != 200:
                reply.end_s = clock()
                return reply
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:  # the stream started, then the router gave up on the request
                    reply.error, reply.end_s = chunk["error"], clock()
                    return reply
                now = clock()
                reply.usage = chunk.get("usage") or reply.usage
                choices = chunk.get("choices") or []
                if not choices:
                    continue
                reply.first_choice_s = now if reply.first_choice_s is None else reply.first_choice_s
                if choices[0].get("text"):
                    reply.text_s.append(now)
                    reply.text.append(choices[0]["text"])
            reply.done = True
    except (aiohttp.ClientError, OSError, json.JSONDecodeError) as e:
        reply.status, reply.detail = 0, f"{type(e).__name__}: {e}"
    except asyncio.CancelledError:  # the caller's own cancel: what this request saw is still a figure
        reply.cancelled = True
        return reply
    reply.end_s = clock()
    return reply


async def complete(http: aiohttp.ClientSession, base_url: str, model: str, request: BenchRequest,
                   clock: Callable[[], float], salt: str | None = None) -> RequestResult:
    """Send `request` as a streamed completion (ignore_eos, so exactly max_tokens come back) and time it.
    `salt` is sent as cache_salt (the request then shares no prefix with any other). Never raises for
    what the router or the network does: that is the result's outcome. Cancelled (the cell's drain
    ran out), it returns an UNFINISHED result with its TTFT, or its wait so far as a lower bound."""
    body = completion_body(model, request.prompt, request.max_tokens)
    if salt is not None:
        body["cache_salt"] = salt
    reply = await stream_completion(http, f"{base_url}/v1/completions", body, clock)
    first, sent = reply.first_choice_s, reply.sent_s
    if reply.cancelled:
        waited = (first if first is not None else clock()) - sent
        return RequestResult(request.index, Outcome.UNFINISHED, waited, ttft_censored=first is None,
                             detail="cancelled at the end of the cell")
    if reply.error is not None:
        error = reply.error
        refused = error.get("code") == "rate_limit_exceeded" or error.get("type") == "requests"
        return RequestResult(request.index, Outcome.REFUSED if refused else Outcome.FAILED,
                             detail=str(error.get("message", error)))
    if reply.status != 200:
        if reply.status == 0:
            return RequestResult(request.index, Outcome.FAILED, detail=reply.detail)
        outcome = Outcome.REFUSED if reply.status == 429 else Outcome.FAILED
        return RequestResult(request.index, outcome, detail=f"HTTP {reply.status}")
    if first is None:
        return RequestResult(request.index, Outcome.FAILED, detail="the stream ended without a token")
    assert reply.end_s is not None
    gaps = tuple(b - a for a, b in zip(reply.text_s, reply.text_s[1:], strict=False))
    details = reply.usage.get("prompt_tokens_details") or {}
    return RequestResult(request.index, Outcome.OK, first - sent, gaps, reply.end_s - sent,
                         int(reply.usage.get("completion_tokens", request.max_tokens)),
                         int(details.get("cached_tokens", 0)))
