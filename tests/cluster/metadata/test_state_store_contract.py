"""The StateStore contract (cluster/metadata/store.py), one suite run against every store: in-process
memory and Redis (a real redis-server on 127.0.0.1, one per module, a key prefix per test). What a
store records is loaded once its `write_behind` ran (at once for the memory store); `keeps_index`
says whether a store opened again on the same backing sees it."""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

import pytest

from radixmesh.cluster.metadata.store import MemoryStore, RedisStore, StateStore
from tests.support.poll import until
from tests.support.servers import running_redis

pytestmark = pytest.mark.anyio

T = TypeVar("T")
Opener = Callable[[], StateStore]
"""Opens a store on one backing: each call a new instance (a new, empty one for memory)."""


@pytest.fixture(scope="module")
def redis_server() -> Iterator[str]:
    with running_redis() as url:
        yield url


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration)])
def opener(request: pytest.FixtureRequest) -> Opener:
    if request.param == "memory":
        return MemoryStore
    url, prefix = request.getfixturevalue("redis_server"), f"contract-{uuid.uuid4().hex}:"
    return lambda: RedisStore(url, prefix=prefix)


@pytest.fixture
async def store(opener: Opener) -> AsyncIterator[StateStore]:
    s = opener()
    writer = asyncio.create_task(s.write_behind())
    yield s
    writer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await writer
    s.close()


async def loads(load: Callable[[], T], expected: T) -> None:
    """`load()` comes to equal `expected` once the store's writer had its turns."""
    with contextlib.suppress(AssertionError):
        await until(lambda: load() == expected, timeout_s=5.0)
    assert load() == expected


async def test_an_empty_store_loads_nothing(store: StateStore) -> None:
    assert (store.load_nodes(), store.load_counters(), store.load_index(), store.pending()) == ({}, {}, None, 0)


async def test_a_node_record_is_replaced_by_the_next_save(store: StateStore) -> None:
    store.save_node("a", b"a1")
    store.save_node("b", b"b1")
    await loads(store.load_nodes, {"a": b"a1", "b": b"b1"})
    store.save_node("a", b"a2")
    await loads(store.load_nodes, {"a": b"a2", "b": b"b1"})
    await loads(store.pending, 0)


async def test_counters_add_up_by_scope_and_field(store: StateStore) -> None:
    store.add_counters({"total": {"requests": 2, "prompt_tokens": 5}})
    store.add_counters({"total": {"requests": 1}, "node:n": {"requests": 1}})
    await loads(store.load_counters, {"total": {"requests": 3, "prompt_tokens": 5}, "node:n": {"requests": 1}})
    store.add_counters({"node:n": {"requests": 4, "hits": 0}})
    await loads(store.load_counters, {"total": {"requests": 3, "prompt_tokens": 5},
                                      "node:n": {"requests": 5, "hits": 0}})


async def test_index_parts_are_replaced_deleted_and_concatenated(store: StateStore) -> None:
    def index() -> frozenset[bytes]:
        # Parts concatenate in no stated order: every part here is one repeated letter, so the
        # sorted runs name the parts.
        blob = store.load_index()
        return frozenset() if blob is None else frozenset(bytes([c]) * blob.count(c) for c in set(blob))

    store.update_index({"a": b"AA", "b": lambda: b"B"})  # a function is called to encode its part
    await loads(index, frozenset({b"AA", b"B"}))
    store.update_index({"a": None, "c": b"CCC"})
    await loads(index, frozenset({b"B", b"CCC"}))
    store.update_index({"d": b"D"}, replace=True)
    await loads(index, frozenset({b"D"}))
    store.update_index({"": b"XX"}, replace=True)
    await loads(index, frozenset({b"XX"}))
    store.update_index({}, replace=True)
    await loads(store.load_index, None)


async def test_keeps_index_says_whether_a_store_opened_again_sees_the_state(opener: Opener) -> None:
    first = opener()
    first.save_node("n", b"rec")
    first.add_counters({"total": {"requests": 2}})
    first.update_index({"": b"blob"}, replace=True)
    first.close()  # writes what is pending; never ran a writer
    again = opener()
    try:
        seen = (again.load_nodes(), again.load_counters(), again.load_index())
        kept = ({"n": b"rec"}, {"total": {"requests": 2}}, b"blob") if first.keeps_index else ({}, {}, None)
        assert seen == kept
    finally:
        again.close()
