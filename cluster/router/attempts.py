"""A request served across attempts: routed, served on the chosen agent and, when that agent is
unavailable before or during the stream (or busy), excluded and routed again. The router fixes the
seed before the first attempt, so the next node reproduces the same tokens; those already sent are
skipped."""

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from radixmesh.cluster.fleet.agent_client import AgentDirectory, AgentUnavailable
from radixmesh.cluster.policy.inflight import InflightTable
from radixmesh.cluster.policy.step import RoutingStep
from radixmesh.cluster.router.admission import Overloaded
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.metrics import RouterMetrics
from radixmesh.cluster.router.results import NoNodeAvailable, RoutedPlan, RouterItem, RouterResult
from radixmesh.cluster.router.suspects import Suspects
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.limits import AgentBusy, usable_prefix_blocks
from radixmesh.proto.serve.plan import Queued, ServePlan, ServeResult, ServeStats, TokenDelta

logger = logging.getLogger(__name__)

Plan = Callable[[ServePlan, frozenset[NodeId], NodeId | None, str | None], Awaitable[RoutedPlan]]
"""Router.plan: (request, exclude, node, session) -> the decision, held as pending."""


class Attempts:
    """Serves one router's admitted requests. `plan` decides each attempt; `step` and `inflight` are
    the router's own (each attempt ends its pending hold and its in-flight ticket); a node whose
    attempt fails becomes one of `suspects`."""

    def __init__(self, config: RouterConfig, directory: AgentDirectory, plan: Plan, step: RoutingStep,
                 inflight: InflightTable, metrics: RouterMetrics, suspects: Suspects,
                 clock: Callable[[], float]) -> None:
        self.config = config
        self._directory, self._plan, self._step, self._inflight = directory, plan, step, inflight
        self._metrics, self._suspects, self._clock = metrics, suspects, clock

    async def serve(self, request: ServePlan, on_routed: Callable[[NodeId], None] | None, pin: NodeId | None,
                    session: str | None, arrival: float | None = None,
                    on_queued: Callable[[NodeId], None] | None = None) -> AsyncGenerator[RouterItem, None]:
        """Router.generate's items for `request` (its seed fixed); TTFT counts from `arrival` (default:
        now). Raises Overloaded when every node left or tried is busy, NoNodeAvailable when none is
        left or `max_attempts` failed. `on_queued(node)`: a prefill-only request is in `node`'s engine
        (the agent's Queued; each attempt's)."""
        arrival = self._clock() if arrival is None else arrival
        first_token_at: float | None = None
        sent: list[int] = []
        exclude: set[NodeId] = set()
        busy: set[NodeId] = set()
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                routed = await self._plan(request, frozenset(exclude), pin, session)
            except NoNodeAvailable:
                if busy:
                    raise Overloaded(f"every node left is busy ({sorted(busy)}): retry later",
                                     self.config.admission.retry_after_s) from None
                raise
            node = routed.decision.node
            if on_routed is not None:
                on_routed(node)
            client = self._directory.get(node)
            if client is None:
                if routed.hold is not None:
                    self._step.abandon(routed.hold)
                exclude.add(node)
                continue
            usable = usable_prefix_blocks(len(request.prompt_token_ids), self.config.block_size)
            reused = min(routed.decision.local_blocks + routed.decision.pull_blocks, usable)
            expected_local = min(routed.decision.local_blocks, usable) * self.config.block_size
            computed = len(request.prompt_token_ids) - reused * self.config.block_size
            ticket = self._inflight.start(node, computed, routed.decision.pull_s if routed.plan.pull is not None else 0.0)
            self._inflight.record_routed(node, computed)
            stream = client.serve(routed.plan)
            produced = 0
            answered = False
            try:
                async for item in stream:
                    if isinstance(item, Queued):  # not an answer: the prefill has only begun
                        if on_queued is not None:
                            on_queued(node)
                        continue
                    if not answered:  # its prefill is done: a peer may pull this prompt from it now
                        answered = True
                        if routed.hold is not None:
                            self._step.answered(routed.hold)
                    self._inflight.prefilled(ticket)
                    if isinstance(item, TokenDelta):
                        tokens, logprobs = item.token_ids, item.logprobs
                    else:
                        tokens, logprobs = item.output_token_ids[produced:], item.output_logprobs[produced:]
                    # This attempt's tokens [produced, produced + len) overlap what was sent up to len(sent).
                    new = tokens[max(0, len(sent) - produced):]
                    if tokens[: len(tokens) - len(new)] != tuple(sent[produced : produced + len(tokens) - len(new)]):
                        logger.warning("request %s: retry on %s diverged from the tokens already sent",
                                       request.request_id, node)
                    produced += len(tokens)
                    if new:
                        first_token_at = first_token_at if first_token_at is not None else self._clock()
                        sent.extend(new)
                        yield TokenDelta(request.request_id, tuple(new), logprobs[len(tokens) - len(new):])
                    if isinstance(item, ServeResult):
                        ttft = (first_token_at if first_token_at is not None else self._clock()) - arrival
                        self._served(routed, item.stats, usable, reused, len(request.prompt_token_ids),
                                     expected_local, ttft)
                        yield RouterResult(item, routed, attempt, ttft)
                        return
                raise AgentUnavailable(f"agent {node} ended the stream without a result")
            except AgentBusy as e:  # refused before anything ran: another node may take it
                logger.info("request %s: %s; trying another node", request.request_id, e)
                busy.add(node)
                exclude.add(node)
            except AgentUnavailable as e:
                logger.warning("request %s: agent %s unavailable (%s); %d token(s) already sent, retrying",
                               request.request_id, node, e, len(sent))
                self._metrics.record_failed_attempt(node)
                self._suspects.failed(node)
                exclude.add(node)
                if routed.hold is not None:  # answered or not, the node is not to be counted on
                    self._step.abandon(routed.hold)
            finally:
                if not answered and routed.hold is not None:  # refused or given up before its answer
                    self._step.abandon(routed.hold)
                self._inflight.finish(ticket)
                # Close the agent's stream now (not at garbage collection) so it frees the request's blocks.
                await stream.aclose()
        if busy and busy == exclude:
            raise Overloaded(f"every node tried is busy ({sorted(busy)}): retry later", self.config.admission.retry_after_s)
        raise NoNodeAvailable(f"request {request.request_id}: {len(exclude)} node(s) failed: {sorted(exclude)}")

    def _served(self, routed: RoutedPlan, stats: ServeStats, usable: int, reused: int, prompt: int,
                expected_local: int, ttft_s: float) -> None:
        """Count a finished attempt: its tokens by source, its TTFT, its decision's outcome."""
        self._metrics.record_served(routed.decision.node, stats, self.config.block_size, routed.cluster_tokens,
                                    expected_local, ttft_s)
        self._record_outcome(routed, stats, usable, reused, prompt, ttft_s)

    def _record_outcome(self, routed: RoutedPlan, stats: ServeStats, usable: int, reused: int, prompt: int,
                        ttft_s: float) -> None:
        """The decision's prediction beside what the agent and the router measured (calibration.py)."""
        d, bs = routed.decision, self.config.block_size
        longest = max((min(v.local_blocks, usable) for v in routed.view.nodes), default=0)
        self._metrics.calibration.add(
            predicted_ttft_s=d.est_ttft_s, realized_ttft_s=ttft_s,
            predicted_pull_s=d.pull_s if routed.plan.pull is not None else 0.0, realized_pull_s=stats.pull_seconds,
            pull_time_factor=routed.view.pull_time_factor, wait_time_factor=routed.view.wait_time_factor,
            agent_ttft_s=stats.ttft_s, predicted_computed=prompt - reused * bs, realized_computed=stats.tokens.computed,
            left_tokens=max(0, longest - reused) * bs,
            bought_s=d.longest_ttft_s - d.est_ttft_s if d.longest_ttft_s is not None else None)
        self._metrics.calibration.tune(self._step)
