"""EngineAgentClient: an external engine's OpenAI server (vLLM, SGLang) as an AgentClient.

A ServePlan becomes one streaming `POST /v1/completions` (token ids, the plan's sampling and seed,
`cache_salt` = the tenant, `return_token_ids`); realized hits are the reply's cached tokens, counted
as local gpu hits. A plan's pull is never executed: the engine's memory is not ours. Errors follow
AgentClient's contract (4xx -> InvalidRequest; unreachable, 5xx, a broken stream or no token ids ->
AgentUnavailable); the reset goes to the engine's own endpoint. The fields and why:
docs/routing.md#external-engines-vllm-sglang-and-ray-serve.
"""

import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import aiohttp

from radixmesh.cluster.fleet.agent_client import AgentUnavailable
from radixmesh.cluster.fleet.ingest.external_engine import ExternalEngineConfig, LazySession
from radixmesh.common.metrics.scrape import ScrapeTarget
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import RequestHits
from radixmesh.proto.serve.limits import AgentBusy, InvalidRequest
from radixmesh.proto.serve.plan import ServeItem, ServePlan, ServeResult, ServeStats, TokenDelta
from radixmesh.proto.serve.sampling import FinishReason
from radixmesh.proto.serve.tokens import TokenSources

logger = logging.getLogger(__name__)

RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")
"""vLLM's reset, then SGLang's: the client is not told the engine's kind, and each engine answers 404
to the other's path."""


class EngineAgentClient:
    """Serves plans on one external engine. `on_hits` receives each finished request's hits (the
    engine's ExternalEngineNode.record_hits, so its heartbeats report them)."""

    def __init__(self, config: ExternalEngineConfig, *, on_hits: Callable[[RequestHits], None] | None = None,
                 extra_metrics: Callable[[], str] | None = None, session: aiohttp.ClientSession | None = None,
                 clock: Callable[[], float] = time.monotonic, read_timeout_s: float = 300.0) -> None:
        """`extra_metrics` is appended to the engine's own /metrics (its ingestion's radixmesh metrics)."""
        self.config = config
        self.node: NodeId = config.node_id
        self._on_hits = on_hits
        self._extra_metrics = extra_metrics
        self._session = LazySession(session)
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=read_timeout_s)

    def request_body(self, plan: ServePlan) -> dict[str, Any]:
        """The /v1/completions body for `plan` (vLLM's extra fields included)."""
        s = plan.sampling
        body: dict[str, Any] = {
            "model": self.config.model,
            "prompt": list(plan.prompt_token_ids),
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = list(s.stop)
        if s.stop_token_ids:
            body["stop_token_ids"] = list(s.stop_token_ids)
        if s.ignore_eos:
            body["ignore_eos"] = True
        if plan.tenant:
            body["cache_salt"] = plan.tenant
        return body

    async def serve(self, plan: ServePlan) -> AsyncGenerator[ServeItem, None]:
        if plan.sampling.logprobs is not None:
            # vLLM names alternatives by their text, not their ids: nothing to carry them in faithfully.
            raise InvalidRequest(f"engine {self.node} does not serve logprobs through radixmesh")
        url = f"{self.config.base_url}/v1/completions"
        start = self._clock()
        first: float | None = None
        output: list[int] = []
        finish: str | None = None
        usage: dict[str, Any] | None = None
        try:
            async with self._session.get().post(url, json=self.request_body(plan), timeout=self._timeout,
                                                headers={**self.config.headers, "X-Request-Id": plan.request_id}) as r:
                _check_credentials(self.node, r.status)
                if 400 <= r.status < 500:
                    raise InvalidRequest(f"engine {self.node}: {_error_message(await r.text())}")
                if r.status != 200:
                    raise AgentUnavailable(f"engine {self.node}: HTTP {r.status}")
                async for chunk in _sse(r):
                    for choice in chunk.get("choices") or ():
                        ids = choice.get("token_ids")
                        if ids is None and choice.get("text"):
                            raise AgentUnavailable(f"engine {self.node} returns no token ids "
                                                   "(vLLM >= 0.10.2 returns them with return_token_ids)")
                        if ids:
                            first = first if first is not None else self._clock()
                            output += ids
                            yield TokenDelta(plan.request_id, tuple(ids))
                        finish = choice.get("finish_reason") or finish
                    usage = chunk.get("usage") or usage
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            if isinstance(e, InvalidRequest):
                raise
            raise AgentUnavailable(f"engine {self.node}: {type(e).__name__}: {e}") from e
        if finish is None:
            raise AgentUnavailable(f"engine {self.node}: the stream ended without a finish reason")
        end = self._clock()
        prompt = len(plan.prompt_token_ids)
        cached = _cached_tokens(usage)
        tokens = TokenSources.of_prompt(prompt, local_gpu=min(max(cached, 0), prompt))
        stats = ServeStats(tokens, 0, 0.0, plan.pull is not None, (first or end) - start, end - (first or end), 0)
        if self._on_hits is not None:
            self._on_hits(RequestHits(plan.request_id, plan.tenant, tokens))
        reason = FinishReason.LENGTH if finish == "length" else FinishReason.STOP
        yield ServeResult(plan.request_id, self.node, tuple(output), reason, stats)

    async def prometheus_text(self) -> str:
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.metrics_timeout_s)
            async with self._session.get().get(f"{self.config.base_url}/metrics", timeout=timeout,
                                               headers=self.config.headers) as r:
                _check_credentials(self.node, r.status)
                r.raise_for_status()
                text = await r.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise AgentUnavailable(f"engine {self.node} metrics: {e}") from e
        if self._extra_metrics is None:
            return text
        return text + ("" if text.endswith("\n") or not text else "\n") + self._extra_metrics()

    async def reset_prefix_cache(self) -> dict[str, int]:
        """Ask the engine to drop its prefix cache (RESET_PATHS, the first it serves). Returns {}: the
        engine does not say how many blocks it dropped, so no tier count is reported (a -1 would
        corrupt the router's total). Raises AgentBusy when it refuses (HTTP 400 or 409: SGLang
        refuses while requests wait or run; vLLM's API server answers 200 without checking),
        AgentUnavailable when it is unreachable, fails, or serves neither path."""
        for path in RESET_PATHS:
            try:
                async with self._session.get().post(f"{self.config.base_url}{path}", timeout=self._timeout,
                                                    headers=self.config.headers) as r:
                    status, text = r.status, await r.text()
            except (aiohttp.ClientError, TimeoutError) as e:
                raise AgentUnavailable(f"engine {self.node} reset: {type(e).__name__}: {e}") from e
            _check_credentials(self.node, status)
            if 200 <= status < 300:
                logger.info("engine %s reset its prefix cache (%s)", self.node, path)
                return {}
            if status in (400, 409):  # SGLang's body reads "Cache flushed." even then: leave it out
                raise AgentBusy(f"engine {self.node} refused the reset (HTTP {status}; SGLang refuses while "
                                "requests wait or run)")
            if status not in (404, 405):
                raise AgentUnavailable(f"engine {self.node} reset: HTTP {status}: {_error_message(text)}")
        raise AgentUnavailable(f"engine {self.node} serves no cache reset ({' or '.join(RESET_PATHS)}; vLLM "
                               "serves its own with VLLM_SERVER_DEV_MODE=1)")

    async def scrape_target(self) -> ScrapeTarget | None:
        """None: the engine's own /metrics is the operator's existing vLLM scrape; its ingestion
        metrics reach Prometheus through the router's."""
        return None

    async def close(self) -> None:
        await self._session.close()


async def _sse(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, up to `data: [DONE]`."""
    async for raw in response.content:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise AgentUnavailable(f"a stream chunk is a JSON object, got {type(chunk).__name__}")
        if "error" in chunk:
            raise AgentUnavailable(f"the engine failed mid-stream: {_error_message(data)}")
        yield chunk


def _check_credentials(node: NodeId, status: int) -> None:
    """AgentUnavailable when the engine refuses the front's own credential (401/403): that is the
    operator's configuration, never the client's request, so it must not reach the client as a 400."""
    if status in (401, 403):
        raise AgentUnavailable(f"engine {node} refused the front's credential (HTTP {status}): give the engine's "
                               "API key in its spec (key-env=VAR)")


def _cached_tokens(usage: dict[str, Any] | None) -> int:
    details = (usage or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) else 0


def _error_message(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text[:300]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", error))[:300]
    return str(body.get("message", body) if isinstance(body, dict) else body)[:300]
