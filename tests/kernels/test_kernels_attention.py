"""Paged decode and prefill attention, both implementations, against float64 dense attention.

Each case lays random K/V into a poisoned (NaN) pool through random, non-contiguous block tables whose
first blocks are shared between sequences; table padding holds -1 and outputs start as NaN, so a kernel
that reads a wrong slot or skips an element fails. Without CUDA the Triton kernels run under
TRITON_INTERPRET=1, set below before anything imports them (radixmesh.kernels imports its Triton
modules lazily, on first use); with CUDA they run compiled.
"""

import math
import os
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixmesh.kernels.decode_attention_triton import paged_decode_attention_triton
from radixmesh.kernels.ops import paged_decode_attention, paged_prefill_attention, plan_decode

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KV_HEADS, HEAD_DIM, LAYERS, LAYER = 2, 16, 2, 1
# Float32 inputs against a float64 oracle: only accumulation order differs.
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
# The interpreter's tl.dot mishandles bfloat16 (numpy has no bf16), so bf16 is checked compiled only.
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


@pytest.fixture(params=["torch", "triton"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("RADIXMESH_KERNELS", request.param)
    return str(request.param)


@dataclass(frozen=True, slots=True)
class PagedCase:
    """Sequences laid into a pool: logical K/V per sequence and the paged view of the same values."""

    kv: torch.Tensor  # [num_blocks, layers, 2, bs, kv_heads, head_dim]; all but the live slots NaN
    tables: torch.Tensor  # int32 [B, max_blocks], padding -1
    keys: list[torch.Tensor]  # per sequence [len, kv_heads, head_dim]
    values: list[torch.Tensor]

    @property
    def cache_k(self) -> torch.Tensor:
        return self.kv[:, LAYER, 0]

    @property
    def cache_v(self) -> torch.Tensor:
        return self.kv[:, LAYER, 1]


def make_case(gen: torch.Generator, lens: list[int], block_size: int, dtype: torch.dtype,
              shared_blocks: int) -> PagedCase:
    """Tables: `shared_blocks` common blocks, then each sequence's own, all from a random permutation."""
    own = [-(-n // block_size) - shared_blocks for n in lens]
    assert min(own) >= 0
    num_blocks = shared_blocks + sum(own) + 3  # spare blocks stay NaN
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    shared, physical = physical[:shared_blocks], physical[shared_blocks:]
    max_blocks = max(shared_blocks + n for n in own) + 1
    tables = torch.full((len(lens), max_blocks), -1, dtype=torch.int32)
    kv = torch.full((num_blocks, LAYERS, 2, block_size, KV_HEADS, HEAD_DIM), float("nan"), dtype=dtype)
    values = torch.randn(kv.shape, generator=gen).to(dtype)
    keys_out, values_out = [], []
    for b, n in enumerate(lens):
        row = shared + physical[: own[b]]
        physical = physical[own[b]:]
        tables[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
        for i, block in enumerate(row):
            live = min(block_size, n - i * block_size)  # the last block's tail stays NaN
            kv[block, :, :, :live] = values[block, :, :, :live]
        flat = kv[row][:, LAYER].transpose(0, 1).reshape(2, -1, KV_HEADS, HEAD_DIM)[:, :n]
        keys_out.append(flat[0])
        values_out.append(flat[1])
    return PagedCase(kv.to(DEVICE), tables.to(DEVICE), keys_out, values_out)


def dense_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first_pos: int,
                    scale: float) -> torch.Tensor:
    """Float64 oracle on unpaged K/V: query i sits at position first_pos + i and sees keys 0..its own."""
    group = q.shape[1] // keys.shape[1]
    k = keys.double().cpu().repeat_interleave(group, dim=1)
    v = values.double().cpu().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double().cpu(), k) * scale
    pos = torch.arange(keys.shape[0])[None, :] > (first_pos + torch.arange(q.shape[0]))[:, None]
    scores = scores.masked_fill(pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v)


def check_decode(gen: torch.Generator, lens: list[int], group: int, block_size: int, dtype: torch.dtype,
                 shared_blocks: int) -> None:
    case = make_case(gen, lens, block_size, dtype, shared_blocks)
    q = torch.randn((len(lens), KV_HEADS * group, HEAD_DIM), generator=gen).to(dtype).to(DEVICE)
    scale = 1 / math.sqrt(HEAD_DIM)
    out = torch.full_like(q, float("nan"))
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    plan = plan_decode(case.tables, seq_lens, case.cache_k, q.shape[1])
    got = paged_decode_attention(q, case.cache_k, case.cache_v, plan, scale, out=out)
    assert got is out
    for b, n in enumerate(lens):
        want = dense_attention(q[b : b + 1], case.keys[b], case.values[b], n - 1, scale)
        torch.testing.assert_close(out[b : b + 1].double().cpu(), want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_matches_dense_attention(backend: str, group: int, block_size: int) -> None:
    gen = torch.Generator().manual_seed(group * 100 + block_size)
    # Lengths off block multiples, one a single token, two sharing their first block(s).
    lens = [2 * block_size + 1, 37, 1] if block_size > 1 else [3, 37, 1]
    check_decode(gen, lens, group, block_size, torch.float32, shared_blocks=1)


@pytest.mark.parametrize("dtype", DTYPES[1:])
def test_decode_half_precision_within_tolerance(backend: str, dtype: torch.dtype) -> None:
    check_decode(torch.Generator().manual_seed(7), [19, 50], 4, 16, dtype, shared_blocks=1)


@pytest.mark.parametrize("num_splits", [2, 5])
def test_triton_decode_split_k_merges_splits_and_skips_empty_ones(num_splits: int) -> None:
    # 5 splits over a 6-block table: the 9-token sequence leaves its later splits empty.
    gen = torch.Generator().manual_seed(num_splits)
    case = make_case(gen, [9, 90], 16, torch.float32, shared_blocks=0)
    q = torch.randn((2, 8, HEAD_DIM), generator=gen).to(DEVICE)
    out = torch.full_like(q, float("nan"))
    seq_lens = torch.tensor([9, 90], dtype=torch.int32, device=DEVICE)
    paged_decode_attention_triton(q, case.cache_k, case.cache_v, case.tables, seq_lens, 0.25, out, num_splits)
    for b, n in enumerate([9, 90]):
        want = dense_attention(q[b : b + 1], case.keys[b], case.values[b], n - 1, 0.25)
        torch.testing.assert_close(out[b : b + 1].double().cpu(), want, atol=2e-5, rtol=2e-5)


def check_prefill(gen: torch.Generator, prefixes: list[int], news: list[int], group: int, block_size: int,
                  dtype: torch.dtype, shared_blocks: int) -> None:
    """The tables cover prefix and new tokens, but only the prefix is in the pool: the new tokens' slots
    stay NaN, so the kernel must take their K/V from the k, v arguments."""
    full = make_case(gen, [p + n for p, n in zip(prefixes, news, strict=True)], block_size, dtype, shared_blocks)
    kv = full.kv.clone()
    for b, p in enumerate(prefixes):
        for pos in range(p, p + news[b]):
            kv[int(full.tables[b, pos // block_size]), :, :, pos % block_size] = float("nan")
    cu = torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    k = torch.cat([full.keys[b][p:] for b, p in enumerate(prefixes)]).to(DEVICE)
    v = torch.cat([full.values[b][p:] for b, p in enumerate(prefixes)]).to(DEVICE)
    q = torch.randn((k.shape[0], KV_HEADS * group, HEAD_DIM), generator=gen).to(dtype).to(DEVICE)
    out = torch.full_like(q, float("nan"))
    scale = 1 / math.sqrt(HEAD_DIM)
    prefix_lens = torch.tensor(prefixes, dtype=torch.int32, device=DEVICE)
    got = paged_prefill_attention(q, k, v, kv[:, LAYER, 0], kv[:, LAYER, 1], full.tables, prefix_lens, cu, scale,
                                  out=out)
    assert got is out
    for b, p in enumerate(prefixes):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        want = dense_attention(q[rows], full.keys[b], full.values[b], p, scale)
        torch.testing.assert_close(out[rows].double().cpu(), want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_prefill_matches_dense_attention(backend: str, group: int, block_size: int) -> None:
    gen = torch.Generator().manual_seed(group * 10 + block_size)
    # Prefixes: empty, mid-block, exact blocks; new token counts cross the interpreter's 16-token tiles.
    bs = block_size
    prefixes = [bs, 2 * bs + 3, 2 * bs] if bs > 1 else [1, 19, 2]
    check_prefill(gen, prefixes, [21, 5, 17], group, block_size, torch.float32, shared_blocks=1)


def test_prefill_without_prefix_is_causal_self_attention(backend: str) -> None:
    check_prefill(torch.Generator().manual_seed(3), [0, 0], [18, 1], 4, 16, torch.float32, shared_blocks=0)


def test_prefill_skips_a_sequence_with_no_new_tokens(backend: str) -> None:
    check_prefill(torch.Generator().manual_seed(4), [20, 9], [0, 7], 4, 16, torch.float32, shared_blocks=0)


@pytest.mark.parametrize("dtype", DTYPES[1:])
def test_prefill_half_precision_within_tolerance(backend: str, dtype: torch.dtype) -> None:
    check_prefill(torch.Generator().manual_seed(8), [16, 30], [20, 3], 4, 16, dtype, shared_blocks=1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=4),
    group=st.sampled_from([1, 2, 4, 8]),
    block_size=st.sampled_from([1, 3, 16]),
    seed=st.integers(0, 2**16),
)
def test_torch_decode_reference_matches_dense_for_any_batch(
    monkeypatch: pytest.MonkeyPatch, lens: list[int], group: int, block_size: int, seed: int
) -> None:
    monkeypatch.setenv("RADIXMESH_KERNELS", "torch")
    shared = min(min(lens) // block_size, 2)
    check_decode(torch.Generator().manual_seed(seed), lens, group, block_size, torch.float32, shared)


@pytest.mark.slow
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prefixes=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    data=st.data(),
    group=st.sampled_from([1, 4, 8]),
    block_size=st.sampled_from([1, 5, 16]),
    seed=st.integers(0, 2**16),
)
def test_torch_prefill_reference_matches_dense_for_any_batch(
    monkeypatch: pytest.MonkeyPatch, prefixes: list[int], data: st.DataObject, group: int, block_size: int,
    seed: int,
) -> None:
    monkeypatch.setenv("RADIXMESH_KERNELS", "torch")
    news = data.draw(st.lists(st.integers(1, 24), min_size=len(prefixes), max_size=len(prefixes)))
    shared = min(min(prefixes) // block_size, 2)
    check_prefill(torch.Generator().manual_seed(seed), prefixes, news, group, block_size, torch.float32, shared)
