"""RadixmeshRequestRouter: radixmesh's routing as a Ray Serve request router.

    @serve.deployment(num_replicas=4, request_router_config=RequestRouterConfig(
        request_router_class=RadixmeshRequestRouter,
        request_router_kwargs={"block_size": 16, "policy": "cost_no_pull"}))

Per request it runs the router's own step (policy.step.RoutingStep) with Serve replicas as nodes
and what each was routed as its prefix (no index answer), and offers the chosen replica alone for
the first `affinity_attempts` tries. What it does per request and why: docs/routing.md#ray-serve.
"""

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from radixmesh.cluster.policy.base import PolicyConfig, make_policy
from radixmesh.cluster.policy.inflight import InflightTable, Ticket
from radixmesh.cluster.policy.pending_index import PendingIndex
from radixmesh.cluster.policy.step import RoutingStep
from radixmesh.common.text.tokenizer import ByteTokenizer, Tokenizer
from radixmesh.proto.block_hash import BlockHash, hash_blocks, tenant_salt
from radixmesh.proto.ids import NodeId

logger = logging.getLogger(__name__)
_MAX_UNROUTED = 10_000


def prompt_of(request: PendingRequest, tokenizer: Tokenizer) -> tuple[list[int], str] | None:
    """(token ids, tenant) of the first argument with a `prompt` or `messages` (attribute or key),
    None when there is none. Messages are their contents concatenated (as Ray's prefix router does)."""
    for arg in (*request.args, *request.kwargs.values()):
        prompt = _field(arg, "prompt")
        if prompt is None:
            messages = _field(arg, "messages")
            if isinstance(messages, list):
                prompt = "".join(str(_field(m, "content") or "") for m in messages)
        if prompt is None:
            continue
        tenant = _field(arg, "cache_salt")
        tenant = tenant if isinstance(tenant, str) else ""
        if isinstance(prompt, str):
            return tokenizer.encode(prompt), tenant
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt), tenant
    return None


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


class RadixmeshRequestRouter(RequestRouter):
    """A Serve RequestRouter; configure it with `request_router_kwargs` (initialize_state's)."""

    def initialize_state(self, block_size: int = 16, policy: str = "cost_no_pull", prefix_ttl_s: float = 600.0,
                         prefill_tokens_per_s: float = 2000.0, seed: int | None = None, affinity_attempts: int = 6,
                         clock: Callable[[], float] = time.monotonic, **policy_kwargs: Any) -> None:
        """`policy` names a radixmesh policy (policy_names()); `policy_kwargs` are PolicyConfig fields."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if affinity_attempts < 1:
            raise ValueError(f"affinity_attempts must be >= 1, got {affinity_attempts}")
        self._affinity_attempts = affinity_attempts
        config = PolicyConfig(**policy_kwargs)
        self._block_size = block_size
        self._tokenizer: Tokenizer = ByteTokenizer()
        self._holders = PendingIndex(prefix_ttl_s, clock)
        self._inflight = InflightTable(clock, config.load_half_life_s)
        self._step = RoutingStep(make_policy(policy, config, random.Random(seed)), self._holders, self._inflight,
                                 block_tokens=block_size, default_prefill_tokens_per_s=prefill_tokens_per_s)
        self._routing: dict[str, tuple[list[BlockHash], int, int]] = {}
        """internal request id -> (its block hashes, prompt tokens, tries so far), between choice and routing."""
        self._tickets: dict[str, Ticket] = {}
        self.decisions: list[tuple[str, str]] = []
        """(replica, reason) of recent decisions, newest last (at most 1000), for tests and logs."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        found = prompt_of(pending_request, self._tokenizer) if pending_request is not None else None
        if found is None:
            return [candidate_replicas]
        tokens, tenant = found
        hashes = hash_blocks(tokens, self._block_size, salt=tenant_salt(tenant))
        by_id = {NodeId(r.replica_id.to_full_id_str()): r for r in candidate_replicas}
        decision = self._step.route(hashes, len(tokens), None, list(by_id), record=False).decision
        assert pending_request is not None
        request_id = pending_request.metadata.internal_request_id
        tries = self._routing.pop(request_id, ([], 0, 0))[2] + 1
        self._routing[request_id] = (hashes, len(tokens), tries)
        while len(self._routing) > _MAX_UNROUTED:  # requests cancelled between choice and routing
            del self._routing[next(iter(self._routing))]
        self.decisions = [*self.decisions[-999:], (decision.node, decision.reason)]
        logger.debug("request %s -> replica %s: %s", pending_request.metadata.internal_request_id, decision.node,
                     decision.reason)
        chosen = by_id[decision.node]
        rest = [r for r in candidate_replicas if r is not chosen]
        return [[chosen], rest] if rest and tries >= self._affinity_attempts else [[chosen]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        request_id = pending_request.metadata.internal_request_id
        hashes, tokens, _ = self._routing.pop(request_id, ([], 0, 0))
        node = NodeId(replica_id.to_full_id_str())
        self._step.record(node, hashes, tokens)
        self._tickets[request_id] = self._inflight.start(node, tokens)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        ticket = self._tickets.pop(internal_request_id, None)
        if ticket is not None:
            self._inflight.finish(ticket)
