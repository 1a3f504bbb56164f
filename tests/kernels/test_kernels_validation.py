"""Bad arguments to every kernel entry point: a ValueError naming the problem, and nothing written."""

from collections.abc import Callable

import pytest
import torch

from radixmesh.kernels.ops import (
    gather_blocks,
    paged_decode_attention,
    paged_prefill_attention,
    plan_decode,
    scatter_blocks,
    write_kv,
)

BS, KVH, D, N = 4, 2, 8, 6


@pytest.fixture
def kv() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn((N, 2, 2, BS, KVH, D), generator=gen)


def i32(values: list[int] | list[list[int]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def unchanged_after(kv: torch.Tensor, call: Callable[[], object], match: str) -> None:
    before = kv.clone()
    with pytest.raises(ValueError, match=match):
        call()
    assert torch.equal(kv, before)


@pytest.mark.parametrize(("slots", "match"), [([0, 24], "outside"), ([-1, 3], "outside"), ([5, 5], "twice")])
def test_write_kv_refuses_bad_slots(kv: torch.Tensor, slots: list[int], match: str) -> None:
    k = torch.ones((2, KVH, D))
    unchanged_after(kv, lambda: write_kv(k, k, kv[:, 0, 0], kv[:, 0, 1], i32(slots)), match)


def test_write_kv_refuses_a_dtype_mismatch(kv: torch.Tensor) -> None:
    k = torch.ones((1, KVH, D), dtype=torch.float64)
    unchanged_after(kv, lambda: write_kv(k, k, kv[:, 0, 0], kv[:, 0, 1], i32([0])), "k and v must be")


def decode(kv: torch.Tensor, heads: int, tables: list[list[int]], lens: list[int],
           out: torch.Tensor | None = None) -> torch.Tensor:
    q = torch.ones((len(lens), heads, D))
    plan = plan_decode(i32(tables), i32(lens), kv[:, 0, 0], heads)
    return paged_decode_attention(q, kv[:, 0, 0], kv[:, 0, 1], plan, 1.0, out=out)


@pytest.mark.parametrize(
    ("heads", "tables", "lens", "match"),
    [
        (4, [[0, 1]], [0], ">= 1"),
        (4, [[0, 1]], [9], "capacity"),
        (4, [[0, N]], [5], "outside"),
        (4, [[-1, 1]], [1], "outside"),
        (3, [[0, 1]], [2], "multiple of kv_heads"),
    ],
)
def test_decode_refuses_bad_tables_and_lengths(kv: torch.Tensor, heads: int, tables: list[list[int]],
                                               lens: list[int], match: str) -> None:
    out = torch.full((1, heads, D), float("nan"))
    with pytest.raises(ValueError, match=match):
        decode(kv, heads, tables, lens, out)
    assert torch.isnan(out).all()


def test_decode_ignores_padding_entries_past_the_length(kv: torch.Tensor) -> None:
    assert torch.isfinite(decode(kv, 4, [[2, -7]], [BS])).all()


def test_decode_refuses_int64_block_tables(kv: torch.Tensor) -> None:
    tables = torch.zeros((1, 2), dtype=torch.int64)
    with pytest.raises(ValueError, match="block_tables must be int32"):
        plan_decode(tables, i32([1]), kv[:, 0, 0], 4)


def test_decode_refuses_a_misshapen_out(kv: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="out must be"):
        decode(kv, 4, [[0]], [1], out=torch.empty((1, 4, D + 1)))


@pytest.mark.parametrize(("cu", "prefix", "match"),
                         [([0, 3], [0], "rise from 0 to 4"), ([0, 3, 2, 4], [0, 0, 0], "rise"),
                          ([0, 4], [-1], ">= 0"), ([0, 4], [9], "capacity")])
def test_prefill_refuses_bad_bounds(kv: torch.Tensor, cu: list[int], prefix: list[int], match: str) -> None:
    q, k = torch.ones((4, 4, D)), torch.ones((4, KVH, D))
    tables = i32([[0, 1]] * len(prefix))
    with pytest.raises(ValueError, match=match):
        paged_prefill_attention(q, k, k, kv[:, 0, 0], kv[:, 0, 1], tables, i32(prefix), i32(cu), 1.0)


def test_gather_refuses_ids_outside_the_pool(kv: torch.Tensor) -> None:
    out = torch.full((2, *kv.shape[1:]), float("nan"))
    with pytest.raises(ValueError, match="outside"):
        gather_blocks(kv, [1, N], out=out)
    assert torch.isnan(out).all()


@pytest.mark.parametrize(("ids", "match"), [([0, 0], "distinct"), ([N, 0], "outside"), ([0], "buffer must be")])
def test_scatter_refuses_bad_ids(kv: torch.Tensor, ids: list[int], match: str) -> None:
    buffer = torch.zeros((2, *kv.shape[1:]))
    unchanged_after(kv, lambda: scatter_blocks(buffer, kv, ids), match)


def test_decode_refuses_a_call_that_does_not_fit_its_plan(kv: torch.Tensor) -> None:
    plan = plan_decode(i32([[0, 1]]), i32([5]), kv[:, 0, 0], 4)
    out = torch.full((1, 4, D), float("nan"))
    with pytest.raises(ValueError, match="for this plan|plan's"):  # two sequences' queries, one planned
        paged_decode_attention(torch.ones((2, 4, D)), kv[:, 0, 0], kv[:, 0, 1], plan, 1.0)
    with pytest.raises(ValueError, match="plan's"):  # another layout: the planned rows would be wrong
        paged_decode_attention(torch.ones((1, 4, D)), kv[:, 0, 0].contiguous(), kv[:, 0, 1], plan, 1.0, out=out)
    assert torch.isnan(out).all()


def test_decode_plan_refuses_caches_not_strided_in_whole_heads() -> None:
    odd = torch.zeros((N, BS, KVH, D + 1))[..., :D]
    with pytest.raises(ValueError, match="whole heads"):
        plan_decode(i32([[0]]), i32([1]), odd, 4)
