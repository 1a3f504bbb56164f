"""The Redis store's counter-batch markers: one key per writer however many flushes it makes (issue 28,
finding 9: a key per flush with a 24 h ttl was about 5.5 M keys at 64 nodes), and still no batch
counted twice when its reply is lost."""

import asyncio
from typing import Any

import pytest
import redis

from radixmesh.cluster.metadata.store import RedisStore

pytestmark = pytest.mark.integration

PREFIX = "radixmesh:"
STATE_KEYS = {f"{PREFIX}scopes", f"{PREFIX}counters:total", f"{PREFIX}nodes", f"{PREFIX}index"}
"""What the store keeps besides markers."""
FLUSHES = 40


def marker_keys(url: str) -> dict[str, int]:
    """Every key the store wrote that is not state, with its ttl in seconds."""
    r = redis.Redis.from_url(url)
    try:
        return {k.decode(): r.ttl(k) for k in r.keys(f"{PREFIX}*") if k.decode() not in STATE_KEYS}  # type: ignore[union-attr]
    finally:
        r.close()


async def flush_requests(store: RedisStore, times: int) -> None:
    for _ in range(times):
        store.add_counters({"total": {"requests": 1}})
        await store.flush()


def test_many_flushes_leave_one_marker_key_per_writer(redis_url: str) -> None:
    first, second = RedisStore(redis_url), RedisStore(redis_url)

    async def body() -> None:
        await flush_requests(first, FLUSHES)
        await flush_requests(second, FLUSHES)

    asyncio.run(body())
    markers = marker_keys(redis_url)
    assert len(markers) == 2, sorted(markers)
    assert all(0 < ttl <= 86400 for ttl in markers.values()), markers
    again = RedisStore(redis_url)
    assert again.load_counters() == {"total": {"requests": 2 * FLUSHES}}
    for store in (first, second, again):
        store.close()


def test_a_batch_whose_reply_was_lost_is_counted_once(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RedisStore(redis_url)
    real_eval = store._async.eval
    losses = [redis.ConnectionError("reply lost")]

    async def eval_then_lose_the_reply(*args: Any) -> Any:
        result = await real_eval(*args)
        if losses:  # the first reply only
            raise losses.pop()
        return result

    monkeypatch.setattr(store._async, "eval", eval_then_lose_the_reply)

    async def body() -> None:
        store.add_counters({"total": {"requests": 3}})
        with pytest.raises(redis.ConnectionError):
            await store.flush()  # Redis added the batch, the store does not know
        store.add_counters({"total": {"requests": 4}})  # recorded meanwhile: the next batch
        await store.flush()

    asyncio.run(body())
    assert store.pending() == 0
    again = RedisStore(redis_url)
    assert again.load_counters() == {"total": {"requests": 7}}
    assert len(marker_keys(redis_url)) == 1
    for s in (store, again):
        s.close()
