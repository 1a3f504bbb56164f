"""Hit accounting: what the cluster really reused, compared with what Match predicted.

Per finished request a node reports prompt tokens served from its gpu, its host tier, a peer (remote
pull), and the rest recomputed (miss). If the router gave Match a request id, the prediction made
then is joined with the report:

- routing regret: tokens Match saw cached somewhere in the cluster that were recomputed anyway;
- index precision: of the prefix Match said the serving node held, the part it really found.

Counters are cumulative token counts per scope ("total", "node:<id>", "tenant:<name>"); `record`
returns its increments so the service can persist them in the state store.
"""

from collections import OrderedDict
from dataclasses import dataclass

from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.hits import HitCounters, HitStats, RequestHits

TOTAL = "total"
OTHER_TENANTS = "(other)"
"""The tenant scope that counts every tenant past `max_tenants`: tenant names come from clients, so
their counters (kept in memory and in the state store) must not grow with every name sent."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """What Match answered for one request, in tokens."""

    cluster_tokens: int
    """Leading tokens held by some live node."""
    local_tokens: dict[NodeId, int]
    """Leading tokens each node held itself (either tier)."""


class HitAccounting:
    """Joins Match predictions with realized hits. Predictions are kept for the newest
    `max_predictions` request ids only, so a router that never reports cannot grow memory."""

    def __init__(self, max_predictions: int = 65536, max_tenants: int = 1024) -> None:
        if max_predictions < 1 or max_tenants < 1:
            raise ValueError(f"max_predictions and max_tenants must be >= 1, got {max_predictions}, {max_tenants}")
        self._max_predictions = max_predictions
        self._max_tenants = max_tenants
        self._tenants = 0
        self._predictions: OrderedDict[str, Prediction] = OrderedDict()
        self._counters: dict[str, HitCounters] = {}

    def predict(self, request_id: str, prediction: Prediction) -> None:
        self._predictions[request_id] = prediction
        self._predictions.move_to_end(request_id)
        if len(self._predictions) > self._max_predictions:
            self._predictions.popitem(last=False)

    def record(self, node: NodeId, hits: RequestHits) -> dict[str, dict[str, int]]:
        """Count one finished request served by `node`; returns the increments by scope."""
        t = hits.tokens
        delta = {
            "requests": 1,
            "prompt_tokens": t.prompt,
            "local_gpu_tokens": t.local_gpu,
            "local_host_tokens": t.local_host,
            "local_disk_tokens": t.local_disk,
            "remote_tokens": t.remote,
            "miss_tokens": t.computed,
        }
        prediction = self._predictions.pop(hits.request_id, None) if hits.request_id else None
        if prediction is not None:
            cached = min(prediction.cluster_tokens, t.prompt)
            predicted_local = min(prediction.local_tokens.get(node, 0), t.prompt)
            local = t.local
            delta["cluster_cached_tokens"] = cached
            delta["regret_tokens"] = max(0, cached - t.hits)
            delta["predicted_local_tokens"] = predicted_local
            delta["realized_local_tokens"] = min(local, predicted_local)
        tenant = f"tenant:{hits.tenant}"
        if tenant not in self._counters and self._tenants >= self._max_tenants:
            tenant = f"tenant:{OTHER_TENANTS}"
        deltas = {TOTAL: delta, f"node:{node}": delta, tenant: delta}
        self.add(deltas)
        return deltas

    def add(self, deltas: dict[str, dict[str, int]]) -> None:
        """Add increments by scope (from `record`, or counters loaded from the state store)."""
        for scope, delta in deltas.items():
            if scope.startswith("tenant:") and scope not in self._counters:
                self._tenants += 1
            self._counters[scope] = self._counters.get(scope, HitCounters()).plus(delta)

    def stats(self) -> HitStats:
        def scoped(prefix: str) -> dict[str, HitCounters]:
            return {s[len(prefix) :]: c for s, c in self._counters.items() if s.startswith(prefix)}

        return HitStats(self._counters.get(TOTAL, HitCounters()), scoped("node:"), scoped("tenant:"))
