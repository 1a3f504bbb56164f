"""The simulator with router replicas and the replica's candidate set (holders + least loaded)."""

import dataclasses

import pytest

from radixmesh.cluster.sim.config import SimConfig
from radixmesh.cluster.sim.simulator import SimRequest, Simulator, prepare
from radixmesh.cluster.sim.trace import TraceRequest

BASE = SimConfig(nodes=6, capacity_blocks=40, prefill_tokens_per_s=512.0, kv_bytes_per_token=1,
                 pull_bytes_per_s=5120.0, pull_latency_s=0.0, candidates=0, check_every=1)
"""Every node scored (candidates=0), the baseline the candidate sets are compared with."""


def burst() -> list[SimRequest]:
    # 40 one-block requests spread the load, then siblings of two prefixes arrive together.
    rows = [(float(i), (100 + i,)) for i in range(40)]
    rows += [(60.0 + i / 10, (i % 2, 10 + i % 2, 20 + i)) for i in range(8)]
    return prepare([TraceRequest(t, 512 * len(ids), 1, ids) for t, ids in rows])


def test_routers_that_share_nothing_but_the_index_co_locate_less_and_sharing_restores_it() -> None:
    config = dataclasses.replace(BASE, policy="prefix_affinity")
    one = Simulator(config).run(burst())
    two = Simulator(dataclasses.replace(config, routers=2)).run(burst())
    both = Simulator(dataclasses.replace(config, routers=2, shared_pending=True))
    both.share_recent_work()
    # Each router's own recent-work table sees half the work: its bounded-load cap differs from the
    # fleet's, and siblings that one router would keep on their holder are spread.
    assert one.hits_by_source["local"] > two.hits_by_source["local"]
    assert both.run(burst()).hits_by_source["local"] >= one.hits_by_source["local"]


@pytest.mark.parametrize("routers", [1, 2])
def test_holders_plus_least_loaded_keep_the_invariants_and_the_hits(routers: int) -> None:
    every = Simulator(dataclasses.replace(BASE, routers=routers)).run(burst())
    few = Simulator(dataclasses.replace(BASE, routers=routers, candidates=2)).run(burst())
    assert few.hits_by_source["local"] + few.hits_by_source["remote"] >= (
        every.hits_by_source["local"] + every.hits_by_source["remote"]) - 2
    assert few.max_tokens_over_mean <= every.max_tokens_over_mean * 1.5


def test_routers_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="routers"):
        dataclasses.replace(BASE, routers=0)
