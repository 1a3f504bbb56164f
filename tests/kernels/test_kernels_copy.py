"""write_kv, gather_blocks and scatter_blocks, both implementations: exact equality with a plain loop.

Destinations start as NaN so every element the kernel owes must be written, and every element it does
not own must stay NaN. Without CUDA the Triton kernels run under TRITON_INTERPRET=1 (set before they are
imported; see test_kernels_attention.py).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixmesh.kernels.ops import gather_blocks, scatter_blocks, write_kv
from radixmesh.proto.kv_layout import KVLayout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LAYOUT = KVLayout(model_id="t", num_layers=3, num_kv_heads=2, head_dim=8, dtype="float32", block_size=4)
NUM_BLOCKS = 12
FUZZ = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def exact(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True)


@pytest.fixture(params=["torch", "triton"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("RADIXMESH_KERNELS", request.param)
    return str(request.param)


def poisoned_cache() -> torch.Tensor:
    return torch.full((NUM_BLOCKS, *LAYOUT.block_shape), float("nan"), device=DEVICE)


def random_cache(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((NUM_BLOCKS, *LAYOUT.block_shape), generator=gen).to(DEVICE)


@FUZZ
@given(slots=st.lists(st.integers(0, NUM_BLOCKS * LAYOUT.block_size - 1), unique=True, max_size=20),
       layer=st.integers(0, LAYOUT.num_layers - 1))
def test_write_kv_stores_each_token_in_its_slot_only(backend: str, slots: list[int], layer: int) -> None:
    kv = poisoned_cache()
    k = torch.randn((len(slots), LAYOUT.num_kv_heads, LAYOUT.head_dim), device=DEVICE)
    v = torch.randn_like(k)
    write_kv(k, v, kv[:, layer, 0], kv[:, layer, 1], torch.tensor(slots, dtype=torch.int64, device=DEVICE))
    want = poisoned_cache()
    bs = LAYOUT.block_size
    for t, slot in enumerate(slots):
        want[slot // bs, layer, 0, slot % bs] = k[t]
        want[slot // bs, layer, 1, slot % bs] = v[t]
    exact(kv, want)


@FUZZ
@given(ids=st.lists(st.integers(0, NUM_BLOCKS - 1), max_size=16), seed=st.integers(0, 99))
def test_gather_copies_block_i_into_row_i(backend: str, ids: list[int], seed: int) -> None:
    kv = random_cache(seed)
    out = torch.full((len(ids), *LAYOUT.block_shape), float("nan"), device=DEVICE)
    assert gather_blocks(kv, ids, out=out) is out
    want = torch.stack([kv[i] for i in ids]) if ids else out
    exact(out, want)


@FUZZ
@given(ids=st.lists(st.integers(0, NUM_BLOCKS - 1), unique=True, max_size=NUM_BLOCKS), seed=st.integers(0, 99))
def test_scatter_writes_named_blocks_and_nothing_else(backend: str, ids: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    buffer = torch.randn((len(ids), *LAYOUT.block_shape), generator=gen).to(DEVICE)
    kv = poisoned_cache()
    scatter_blocks(buffer, kv, ids)
    want = poisoned_cache()
    for row, block in enumerate(ids):
        want[block] = buffer[row]
    exact(kv, want)


def test_gather_then_scatter_moves_runs_between_pools(backend: str) -> None:
    # Runs [3, 4, 5] and [9, 10] land on runs [0, 1, 2] and [7, 8] of another pool.
    src = random_cache(1)
    buffer = gather_blocks(src, [3, 4, 5, 9, 10])
    dst = poisoned_cache()
    scatter_blocks(buffer, dst, [0, 1, 2, 7, 8])
    exact(dst[[0, 1, 2, 7, 8]], src[[3, 4, 5, 9, 10]])
    assert torch.isnan(dst[[3, 4, 5, 6, 9, 10, 11]]).all()


def test_gather_into_a_host_buffer_from_any_device() -> None:
    # A host-tier swap: the buffer lives on the CPU whatever the cache's device.
    kv = random_cache(2)
    out = torch.full((2, *LAYOUT.block_shape), float("nan"))
    gather_blocks(kv, [7, 2], out=out)
    exact(out, kv[[7, 2]])
