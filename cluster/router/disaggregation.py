"""Prefill/decode disaggregation in the router's request path (docs/disaggregation.md).

When the directory holds prefill and decode agents, a request is served in two phases, as vLLM's
disaggregated proxy does, over radixmesh's own pull path:

1. prefill: the router's policy routes the prompt among the prefill agents (cached prefix and queue;
   it may plan a pull of a prefix from any agent, a decode agent included), which run it as a
   prefill-only request (ServePlan.prefill_only: its KV computed and cached, no token sampled). A
   prefill agent that fails is excluded and the prompt routed again (Attempts), at most
   `max_attempts` times, then NoNodeAvailable.
2. decode: the decode agent with the fewest requests in flight, then the most free blocks, is sent the
   whole request with a PullPlan of the prompt's usable full blocks from the prefill agent, and its
   tokens stream to the client. A pull that fails is recomputed by the decode agent (plan_pull).

A request whose prompt a decode agent already holds but for a short tail (at most
RouterConfig.local_prefill_max_tokens: a conversation's next turn, where that agent decoded the
last) is served there whole in one phase instead (`local`): handing it to a prefill agent would pull
the conversation to it and back for a tail of a few dozen tokens.

Streamed (RouterConfig.stream_handoff, the default), phase 2 starts as soon as the prefill agent has
queued the prompt (its Queued item), and the decode agent's pull follows the prefill chunk by chunk
(PullPlan.follow): the transfer overlaps the prefill, as SGLang's per-chunk KV sender does. Otherwise
it starts once the prefill has ended. TTFT counts from the request's arrival, so it includes the
prefill, what of the hand-off did not overlap it, and the decode agent's first step.
"""

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from radixmesh.cluster.fleet.agent_client import AgentDirectory
from radixmesh.cluster.policy.base import RouteDecision
from radixmesh.cluster.policy.inflight import InflightTable
from radixmesh.cluster.policy.view import ClusterView, NodeView
from radixmesh.cluster.router.attempts import Attempts
from radixmesh.cluster.router.metrics import RouterMetrics
from radixmesh.cluster.router.results import NoNodeAvailable, RoutedPlan, RouterItem, RouterResult
from radixmesh.cluster.router.suspects import Suspects
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import MatchResult
from radixmesh.proto.serve.limits import usable_prefix_blocks
from radixmesh.proto.serve.plan import PullPlan, ServePlan, ServeStats

logger = logging.getLogger(__name__)

DECODE_POLICY = "decode_least_loaded"
"""The policy label of decode-phase decisions (RouterStats.routing_decisions)."""

def nodes_of(directory: AgentDirectory, role: str) -> frozenset[NodeId]:
    """The agents of `directory` that registered with `role`."""
    return frozenset(n for n in directory.nodes() if directory.role(n) == role)


def is_split(directory: AgentDirectory) -> bool:
    """True while the directory holds at least one prefill agent and one decode agent."""
    return bool(nodes_of(directory, "prefill")) and bool(nodes_of(directory, "decode"))


@dataclass(frozen=True, slots=True)
class Handoff:
    """A prompt prefilled on `node`, whose blocks [0, blocks) a decode agent pulls from `address`."""

    node: NodeId
    address: str
    """The prefill agent's transfer address ("": not known to the router, nothing is pulled)."""
    blocks: int
    """The prompt's usable full blocks (usable_prefix_blocks: the last token's block is never reused)."""
    follow: bool = False
    """The prefill is still computing them: the pull follows it (PullPlan.follow)."""

    def pull(self) -> PullPlan | None:
        if not (self.address and self.blocks):
            return None
        return PullPlan(self.node, self.address, 0, self.blocks, follow=self.follow)


def local_holder(match: MatchResult, decode: frozenset[NodeId], prompt_tokens: int, block_size: int,
                 limit: int) -> NodeId | None:
    """The agent of `decode` to serve a prompt of `prompt_tokens` whole: the one whose gpu holds the
    longest prefix of it (ties: the last by name), when at most `limit` tokens are left to compute
    there; else None."""
    held = [(m.gpu_blocks, m.node_id) for m in match.nodes if m.node_id in decode and m.gpu_blocks > 0]
    if not held:
        return None
    blocks, node = max(held)
    return node if prompt_tokens - blocks * block_size <= limit else None


def prefill_only(request: ServePlan) -> ServePlan:
    """The prefill phase's request: the prompt, prefill-only (no token is sampled; max_tokens 1 is
    what the agent's limits check), nothing that shapes decoding."""
    sampling = dataclasses.replace(request.sampling, max_tokens=1, logprobs=None, stop=(), stop_token_ids=())
    return dataclasses.replace(request, request_id=f"{request.request_id}-prefill", sampling=sampling,
                               prefill_only=True)


def overlap_s(decode_began: float, prefilled: float | None, now: float, pull_s: float) -> float:
    """Of a hand-off's `pull_s` seconds, those before its prefill ended (router clock): from when the
    decode phase began to the prefill's result (`now` when none came: it never ended first), at most
    the whole pull. A hand-off begun after the prefill overlaps nothing."""
    end = prefilled if prefilled is not None else now
    return min(max(0.0, end - decode_began), pull_s)


class PrefillAttempts(Attempts):
    """The prefill phase's attempts: tokens by source and the policy's outcome count as any
    request's; its TTFT is not the client's (DecodeAttempts records that)."""

    def _served(self, routed: RoutedPlan, stats: ServeStats, usable: int, reused: int, prompt: int,
                expected_local: int, ttft_s: float) -> None:
        self._metrics.record_tokens(routed.decision.node, stats, self.config.block_size, routed.cluster_tokens,
                                    expected_local)
        self._record_outcome(routed, stats, usable, reused, prompt, ttft_s)


class DecodeAttempts(Attempts):
    """The decode phase's attempts: its prompt tokens are not counted again, and no policy prediction
    is calibrated (DecodePicker makes none); the hand-off and the client's TTFT are recorded by
    Disaggregation, which knows how far the hand-off overlapped the prefill."""

    def _served(self, routed: RoutedPlan, stats: ServeStats, usable: int, reused: int, prompt: int,
                expected_local: int, ttft_s: float) -> None:
        """Nothing here (see the class)."""


class DecodePicker:
    """Chooses the decode agent (an Attempts Plan): among the decode agents not excluded (suspects
    avoided while another is left), the fewest requests in flight, then the most free blocks as the
    agents heartbeat them (`free_blocks`), then the first by name. The request's pull stays as the
    hand-off planned it."""

    def __init__(self, directory: AgentDirectory, inflight: InflightTable, suspects: Suspects,
                 free_blocks: Callable[[NodeId], int], record: Callable[[str, NodeId], None]) -> None:
        self._directory, self._inflight, self._suspects = directory, inflight, suspects
        self._free_blocks, self._record = free_blocks, record

    async def plan(self, request: ServePlan, exclude: frozenset[NodeId], pin: NodeId | None,
                   session: str | None) -> RoutedPlan:
        decode = sorted(n for n in nodes_of(self._directory, "decode") if n not in exclude)
        if not decode:
            raise NoNodeAvailable(f"no decode agent left to serve request {request.request_id}")
        trusted = [n for n in decode if n not in self._suspects.current()] or decode
        node = min(trusted, key=lambda n: (self._inflight.inflight(n), -self._free_blocks(n)))
        pull = request.pull
        blocks = pull.num_blocks if pull is not None else 0
        decision = RouteDecision(node, 0, pull.peer if pull is not None else None, blocks, 0.0,
                                 f"decode: {self._inflight.inflight(node)} in flight, "
                                 f"{self._free_blocks(node)} free blocks; pulls {blocks} blocks")
        self._record(DECODE_POLICY, node)
        view = ClusterView((NodeView(node, inflight=self._inflight.inflight(node)),))
        return RoutedPlan(request, decision, DECODE_POLICY, 0, False, view)


class Disaggregation:
    """Serves one router's requests in two phases (module doc) over its plan, load table and metrics."""

    def __init__(self, prefill: PrefillAttempts, decode: DecodeAttempts, local: Attempts,
                 local_holder: Callable[[ServePlan], NodeId | None], directory: AgentDirectory,
                 address_of: Callable[[NodeId], str], block_size: int, clock: Callable[[], float],
                 metrics: RouterMetrics, stream: bool = True) -> None:
        """`prefill` plans among the prefill agents, `decode` with a DecodePicker, `local` among the
        decode agents as an aggregated request; `local_holder(request)`: the decode agent to serve it
        whole, or None; `address_of` is a node's transfer address as it registered it ("" unknown);
        `stream`: RouterConfig.stream_handoff."""
        self._prefill, self._decode, self._local, self._local_holder = prefill, decode, local, local_holder
        self._directory = directory
        self._address_of, self._block_size, self._clock = address_of, block_size, clock
        self._metrics, self._stream = metrics, stream

    async def serve(self, request: ServePlan, on_routed: Callable[[NodeId], None] | None, pin: NodeId | None,
                    session: str | None) -> AsyncGenerator[RouterItem, None]:
        """Router.generate's items for `request` (its seed fixed): the decode agent's tokens, then its
        result. Raises what Attempts.serve raises, from either phase (from the prefill phase only
        until the decode phase has begun: then a failed prefill costs the decode agent a recompute)."""
        holder = self._local_holder(request)
        if holder is not None:
            async with contextlib.aclosing(self._local.serve(request, on_routed, holder, session)) as whole:
                async for item in whole:
                    yield item
            return
        arrival = self._clock()
        loop = asyncio.get_running_loop()
        queued: asyncio.Future[NodeId] = loop.create_future()
        prefilled_at: list[float] = []  # the router's clock when the prefill's result came

        def on_queued(node: NodeId) -> None:
            if not queued.done():  # a retried prefill's second Queued: the decode phase follows the first
                queued.set_result(node)

        async def prefill() -> RouterResult:
            result: RouterResult | None = None
            async with contextlib.aclosing(self._prefill.serve(prefill_only(request), on_routed, pin, session,
                                                               on_queued=on_queued)) as items:
                async for item in items:
                    if isinstance(item, RouterResult):
                        result = item
            assert result is not None, "Attempts.serve ends with a result or raises"
            prefilled_at.append(self._clock())
            return result

        prefilling = asyncio.ensure_future(prefill())
        try:
            phases: list[asyncio.Future[Any]] = [prefilling, queued] if self._stream else [prefilling]
            await asyncio.wait(phases, return_when=asyncio.FIRST_COMPLETED)
            follow = queued.done()
            # Streamed: follow the prefill agent that queued the prompt; else (or when the prefill ended,
            # or failed, before any Queued came) the one that served it, or the prefill's error.
            node = queued.result() if follow else prefilling.result().result.node
            blocks = usable_prefix_blocks(len(request.prompt_token_ids), self._block_size)
            handoff = Handoff(node, self._address_of(node), blocks, follow=follow and not prefilling.done())
            decode_request = dataclasses.replace(request, pull=handoff.pull(), handoff=True)
            began = self._clock()
            async with contextlib.aclosing(self._decode.serve(decode_request, on_routed, None, None, arrival)) as items:
                async for item in items:
                    if isinstance(item, RouterResult):
                        await self._settle(prefilling, item)
                        stats = item.result.stats
                        overlap = overlap_s(began, prefilled_at[0] if prefilled_at else None, self._clock(),
                                            stats.pull_seconds)
                        self._metrics.record_handoff(stats, item.routed.decision.pull_blocks, item.ttft_s, overlap)
                    yield item
        finally:
            prefilling.cancel()  # done by now, unless the request ended early or the decode agent recomputed
            await asyncio.gather(prefilling, return_exceptions=True)

    async def _settle(self, prefilling: "asyncio.Future[RouterResult]", decoded: RouterResult) -> None:
        """Before the decode phase's result: let the prefill phase end where its result is due (the
        decode agent pulled every block, so the prefill computed them: its result counts the prompt's
        tokens), or stop it where the decode agent recomputed (its prefill agent failed, maybe to be
        retried elsewhere, or is slower than the pull would wait)."""
        if prefilling.done():
            return
        if decoded.result.stats.pull_failed:
            prefilling.cancel()
        await asyncio.gather(prefilling, return_exceptions=True)
        if not prefilling.cancelled() and prefilling.exception() is not None:
            logger.info("request %s: its prefill phase failed after the hand-off: %r", decoded.result.request_id,
                        prefilling.exception())
