"""bench/two_routers.py's code path on a trace slice: two real routers (own index replicas, requests
alternated) keep the hit rate of one router, and both route on their replicas.

Sequential requests keep the comparison stable: over 4 seeds at 60 requests the two-router hit rate
was within 3 points of one router's (concurrent replays add interleaving noise; the bench reports
its run-to-run spread). The bound, 6 points, is the issue's 2 plus that noise with margin.
"""

import asyncio
from typing import Any

import pytest

from tests.support.bench_scripts import load_bench

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REQUESTS, BOUND_POINTS = 60, 6.0


def test_two_routers_keep_the_hit_rate_of_one() -> None:
    two_routers = load_bench("two_routers")
    replayed = two_routers.prompts("mooncake", REQUESTS)

    async def body() -> tuple[Any, Any]:
        one = await two_routers.run(replayed, routers=1, concurrency=1)
        two = await two_routers.run(replayed, routers=2, concurrency=1)
        return one, two

    one, two = asyncio.run(body())
    assert one.prompt_tokens == two.prompt_tokens == sum(len(p) for p in replayed)
    assert one.replica_decisions == two.replica_decisions == len(replayed)
    assert one.hit_rate > 0.2  # the slice shares prefixes: routing matters
    points = 100 * abs(two.hit_rate - one.hit_rate)
    assert points <= BOUND_POINTS, f"two routers {two.hit_rate:.4f} vs one {one.hit_rate:.4f}"
