"""The owner's side of pulls in one process: validation, pins and chunks against an oracle model."""

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixmesh.node_agent.transfer.protocol import PullRequest, Status
from radixmesh.node_agent.transfer.pull_source import OpenPull, TransferSource
from tests.support.transfer_owner import LAYOUT, SESSION, OwnerSpec, build_source, kv_digest, sequence_hashes

SEQ = sequence_hashes(48)  # the owner caches SEQ[:40]
CACHED = 40


def request(hashes: list, *, fp: str | None = None, max_blocks: int = 1000,
            chunk_bytes: int = 3 * LAYOUT.block_bytes, checksum: str = "crc32") -> PullRequest:
    return PullRequest(9, fp or LAYOUT.fingerprint(), tuple(hashes), max_blocks, chunk_bytes, checksum)


@pytest.fixture
def source() -> TransferSource:
    return build_source(OwnerSpec())


@pytest.mark.parametrize(
    ("req", "status"),
    [
        (request(SEQ[:4], fp="0123456789abcdef"), Status.LAYOUT_MISMATCH),
        (request(SEQ[:4], checksum="md5"), Status.INVALID_ARGUMENT),
        (request(SEQ[:4], chunk_bytes=0), Status.INVALID_ARGUMENT),
        (request(SEQ[:4], chunk_bytes=(1 << 30) + 1), Status.INVALID_ARGUMENT),
    ],
)
def test_refused_requests_pin_nothing(source: TransferSource, req: PullRequest, status: Status) -> None:
    with source.open(req, SESSION) as pull:
        assert (pull.header.status, pull.header.found, pull.blocks) == (status, 0, [])
        assert source.pinned_blocks == 0 and source.cache.pool.num_in_use == 0
    source.check_invariants()


def test_chunks_carry_the_owner_bytes_and_close_unpins(source: TransferSource) -> None:
    with source.open(request(SEQ), SESSION) as pull:  # asks 48, the owner holds 40
        assert (pull.header.status, pull.header.found, pull.header.chunk_blocks) == (Status.OK, 40, 3)
        assert source.pinned_blocks == 40 and source.cache.pool.num_in_use == 40
        payload = torch.cat([p.reshape(-1) for _, p in pull.chunks()])
        assert [t.index for t, _ in pull.chunks()] == list(range(14))  # ceil(40 / 3)
    assert source.pinned_blocks == 0 and source.cache.pool.num_in_use == 0
    received = payload.view(LAYOUT.torch_dtype).view(40, *LAYOUT.block_shape)
    held = source.cache.match(SEQ[:40])
    assert torch.equal(received, source.kv[held])
    assert kv_digest(source.kv, held) == kv_digest(received, list(range(40)))
    source.cache.release(held)


def test_max_blocks_caps_the_pins(source: TransferSource) -> None:
    with source.open(request(SEQ, max_blocks=5), SESSION) as pull:
        assert pull.header.found == 5 and source.cache.pool.num_in_use == 5
    assert source.cache.pool.num_in_use == 0
    source.check_invariants()


def test_close_is_idempotent(source: TransferSource) -> None:
    pull = source.open(request(SEQ[:6]), SESSION)
    pull.close()
    pull.close()
    assert source.pinned_blocks == 0 and source.cache.pool.num_in_use == 0


def test_a_kv_tensor_of_another_layout_is_refused_at_construction(source: TransferSource) -> None:
    with pytest.raises(ValueError, match="does not match layout"):
        TransferSource(source.cache, source.kv[:, :1], LAYOUT)


class PinModel(RuleBasedStateMachine):
    """Concurrent pulls open and close in any order; the oracle is the expected pin count per pull:
    found = min(longest held prefix of the asked hashes, max_blocks), and 0 for refused requests."""

    def __init__(self) -> None:
        super().__init__()
        self.source = build_source(OwnerSpec(num_blocks=48, cached=CACHED))
        self.open: list[tuple[OpenPull, int]] = []

    @rule(start=st.integers(0, 47), length=st.integers(0, 48), max_blocks=st.integers(0, 50),
          good_layout=st.booleans())
    def open_pull(self, start: int, length: int, max_blocks: int, good_layout: bool) -> None:
        asked = SEQ[start : start + length]
        fp = None if good_layout else "0123456789abcdef"
        pull = self.source.open(request(asked, max_blocks=max_blocks, fp=fp), SESSION)
        held = max(0, min(CACHED, start + length) - start)  # the owner holds SEQ[:CACHED]
        expected = min(held, max_blocks) if good_layout else 0
        assert pull.header.found == expected == len(pull.blocks)
        self.open.append((pull, expected))

    @precondition(lambda self: self.open)
    @rule(i=st.integers(0, 100))
    def close_pull(self, i: int) -> None:
        pull, _ = self.open.pop(i % len(self.open))
        pull.close()

    @invariant()
    def pins_match_the_model(self) -> None:
        pinned = sum(n for _, n in self.open)
        assert self.source.pinned_blocks == pinned
        # Every open pull holds one reference on each of its blocks.
        refs = [0] * self.source.cache.pool.num_blocks
        for pull, _ in self.open:
            for b in pull.blocks:
                refs[b] += 1
        assert refs == [self.source.cache.pool.ref_count(b) for b in range(len(refs))]  # type: ignore[arg-type]
        self.source.check_invariants()

    def teardown(self) -> None:
        for pull, _ in self.open:
            pull.close()
        assert self.source.cache.pool.num_in_use == 0


TestPinModel = PinModel.TestCase
TestPinModel.settings = settings(max_examples=40, stateful_step_count=15, deadline=None)
