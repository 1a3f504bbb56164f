"""On a shared-prefix workload (multi-turn chats under a few shared system prompts), the `cost`
policy's global hit rate beats round_robin's and least_loaded's, and bounded load holds.

Real in-process agents publish their cache events to a real metadata service; the router sees
prefixes only through Match (and its own pending holders), exactly as in production.
"""

import asyncio
from collections import Counter

import pytest

from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.cluster.policy.view import NodeView
from radixmesh.cluster.router.results import RouterResult
from radixmesh.cluster.router.router import Router
from radixmesh.common.text.chat_template import (
    END,
    GENERATION_HEADER,
    ChatMessage,
    PlainChatTemplate,
    render_message,
)
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.proto.serve.plan import ServePlan
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.router_cluster import BS, MODEL, local_cluster

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow]
TOK = ByteTokenizer()
SYSTEMS = [f"System prompt {i}: you are assistant number {i}; answer politely, briefly and truthfully." for i in range(3)]
CHATS, TURNS, REPLY, CONCURRENT = 12, 4, 4, 4
# The agents measure ~10k prefill tokens/s here, so the default 2 s load floor (~20k tokens) would
# cover this whole workload (~12k tokens) and bounded load would never bind. 0.1 s (~1k tokens, a
# few prompts) keeps the floor's role (an idle cluster keeps siblings together) and leaves most
# routings to the recent-work share (measured: 40-45 of 48 admitted by "share").
POLICY = PolicyConfig(block_bytes=MODEL.kv_layout("tiny", BS).block_bytes, load_floor_s=0.1)


async def chat(router: Router, c: int, results: list[RouterResult]) -> None:
    """One conversation: each turn's prompt is the last prompt + the reply + the next user message,
    token for token (the reply's bytes go back as the assistant message, as a client would send it)."""
    tokens = TOK.encode(PlainChatTemplate().render([ChatMessage("system", SYSTEMS[c % len(SYSTEMS)]),
                                       ChatMessage("user", f"Question {c}.0 from user {c}?")]))
    for turn in range(TURNS):
        sampling = SamplingParams(max_tokens=REPLY, ignore_eos=True, seed=c)
        result = await router.complete(ServePlan(f"c{c}t{turn}", tuple(tokens), sampling))
        results.append(result)
        user = render_message(ChatMessage("user", f"Follow-up {c}.{turn + 1}?"))
        tokens += [*result.result.output_token_ids, *TOK.encode(END + user + GENERATION_HEADER)]


async def run(policy: str) -> tuple[float, list[RouterResult], PolicyConfig]:
    async with local_cluster(3, publish=True, transfer="ucx", policy=policy, pending_ttl_s=60.0,
                             policy_config=POLICY) as c:
        results: list[RouterResult] = []
        # Conversations run four at a time on three nodes, so load and prefixes both matter (and
        # round robin cannot keep a conversation on one node by accident of lockstep).
        for first in range(0, CHATS, CONCURRENT):
            await asyncio.gather(*(chat(c.router, i, results) for i in range(first, first + CONCURRENT)))
        for a in c.agents:
            await a.check_invariants()
        return c.router.metrics.total.hit_rate, results, c.router.config.policy_config


def load_rule(result: RouterResult, config: PolicyConfig) -> str | None:
    """The bounded-load rule that admitted the chosen node, recomputed from the view the router's
    policy saw (recent work per node as its InflightTable read it), counting what this request would
    compute on each node (its prompt past the node's cached prefix): "share" (within (1 + eps) x the
    mean), "floor" (under floor_s of the node's prefill), "too big" (no node had room, and the chosen
    one had the least work), or None (a violation)."""
    nodes = result.routed.view.nodes
    tokens = len(result.routed.plan.prompt_token_ids)
    blocks = len(result.routed.hashes)
    total = sum(v.recent_tokens for v in nodes)

    def rule(v: NodeView) -> str | None:
        work = tokens - min(v.local_blocks, blocks) * BS
        if v.recent_tokens + work <= (1 + config.load_eps) * (total + work) / len(nodes) * (1 + 1e-9):
            return "share"
        if v.recent_tokens + work <= config.load_floor_s * v.prefill_tokens_per_s:
            return "floor"
        return None

    chosen = next(v for v in nodes if v.node == result.routed.decision.node)
    if rule(chosen) is not None or any(rule(v) for v in nodes):
        return rule(chosen)
    return "too big" if chosen.recent_tokens <= min(v.recent_tokens for v in nodes) * (1 + 1e-9) else None


async def test_cost_policy_beats_the_baselines_and_respects_bounded_load() -> None:
    rates = {}
    for policy in ("cost", "round_robin", "least_loaded"):
        rates[policy], results, config = await run(policy)
        # Every request routed by the policy itself, none by the fallback after a late Match (local_cluster's
        # Match deadline is MATCH_TIMEOUT_S, not the product's 0.5 s a loaded box can outlast).
        assert len(results) == CHATS * TURNS and all(r.routed.policy == policy for r in results)
        if policy == "cost":
            cost_results, cost_config = results, config
    # Measured here (11 runs, 2 cores shared): cost 0.70-0.76 (some of it pulled from peers) under the
    # recent-work cap, round_robin 0.49-0.60, least_loaded 0.53-0.66 (its spread is timing: which
    # agent frees up first), so the margin over least_loaded is the smaller one.
    assert rates["cost"] > rates["round_robin"] + 0.1 and rates["cost"] > rates["least_loaded"] + 0.03, rates
    # Every decision within the bounded-load cap. (Recent work counts computed tokens, so on this
    # workload of cached system prompts the floor admits about as many as the share.)
    rules = Counter(load_rule(r, cost_config) for r in cost_results)
    assert None not in rules and rules["share"] + rules["floor"] > len(cost_results) // 2, rules
    # Every request after a conversation's first turn found at least the system prompt cached.
    later = [r for r in cost_results if not r.result.request_id.endswith("t0")]
    assert all(r.cached_tokens > 0 for r in later)
