"""Following pulls on the owner's side (PullRequest.follow_ms, a streamed hand-off): blocks a request
here is still computing are answered NOT_YET, pinning nothing, and `open_pull` waits for the engine's
steps until they are cached, nobody computes them any more, or the requester's bound has passed."""

import asyncio

import pytest

from radixmesh.node_agent.transfer.protocol import MAX_FOLLOW_MS, PullRequest, Status
from radixmesh.node_agent.transfer.pull_source import TransferSource, open_pull
from radixmesh.proto.block_hash import BlockHash
from tests.support.transfer_owner import LAYOUT, SESSION, OwnerSpec, build_source, sequence_hashes

pytestmark = pytest.mark.anyio
SEQ = sequence_hashes(48)  # the owner caches SEQ[:40]; SEQ[40:] are "being computed" where a test says so


class Steps:
    """A BlockProgress the test drives: which blocks are coming, and each engine step by hand."""

    def __init__(self, coming: list[BlockHash]) -> None:
        self.blocks = set(coming)
        self.steps = 0
        self.waits = 0
        """Times a pull began waiting for a step."""
        self._stepped = asyncio.Event()

    def coming(self, block: BlockHash) -> bool:
        return block in self.blocks

    async def stepped(self, since: int) -> None:
        self.waits += 1
        while self.steps <= since:
            self._stepped.clear()
            await self._stepped.wait()

    def step(self) -> None:
        self.steps += 1
        self._stepped.set()


def following(hashes: list[BlockHash], follow_ms: int = MAX_FOLLOW_MS) -> PullRequest:
    return PullRequest(3, LAYOUT.fingerprint(), tuple(hashes), 1000, 2 * LAYOUT.block_bytes, "crc32",
                       follow_ms=follow_ms)


def source_with(progress: Steps) -> TransferSource:
    s = build_source(OwnerSpec())
    s.progress = progress
    return s


def compute(source: TransferSource, hashes: list[BlockHash], parent: BlockHash) -> None:
    """What a prefill step does to the owner's cache: its blocks computed, cached, and let go."""
    blocks = source.cache.pool.allocate(len(hashes))
    source.cache.insert(hashes, blocks, parent)
    source.cache.release(blocks)


def test_blocks_being_computed_are_answered_not_yet_and_pin_nothing() -> None:
    source = source_with(Steps(SEQ[40:]))
    misses = source.cache.query_blocks
    with source.open(following(SEQ[40:44]), SESSION) as pull:
        assert (pull.header.status, pull.header.found, pull.blocks) == (Status.NOT_YET, 0, [])
        assert source.pinned_blocks == 0 and source.cache.pool.num_in_use == 0
    assert source.cache.query_blocks == misses  # a following round is no cache lookup of the owner's
    source.check_invariants()


def test_blocks_nobody_computes_are_answered_at_once_with_what_is_held() -> None:
    source = source_with(Steps(SEQ[44:]))
    with source.open(following(SEQ[40:44]), SESSION) as pull:  # nothing held, nothing coming
        assert (pull.header.status, pull.header.found) == (Status.OK, 0)
    with source.open(following(SEQ[36:44]), SESSION) as pull:  # held blocks go at once
        assert (pull.header.status, pull.header.found) == (Status.OK, 4)
    source.check_invariants()


def test_a_pull_that_does_not_follow_never_waits() -> None:
    source = source_with(Steps(SEQ[40:]))
    with source.open(following(SEQ[40:44], follow_ms=0), SESSION) as pull:
        assert (pull.header.status, pull.header.found) == (Status.OK, 0)


def test_a_follow_longer_than_the_bound_is_refused() -> None:
    source = source_with(Steps(SEQ[40:]))
    with source.open(following(SEQ[40:44], follow_ms=MAX_FOLLOW_MS + 1), SESSION) as pull:
        assert (pull.header.status, pull.header.found) == (Status.INVALID_ARGUMENT, 0)
        assert "follow_ms" in pull.header.message


async def test_open_pull_waits_for_the_step_that_caches_the_first_block() -> None:
    progress = Steps(SEQ[40:])
    source = source_with(progress)
    opening = asyncio.ensure_future(open_pull(source, following(SEQ[40:48]), SESSION))
    await until_waits(progress, 1)
    progress.step()  # a step that cached none of them (another request's): it waits again
    await until_waits(progress, 2)
    compute(source, SEQ[40:43], SEQ[39])
    progress.blocks -= set(SEQ[40:43])
    progress.step()
    pull = await opening
    with pull:
        assert (pull.header.status, pull.header.found) == (Status.OK, 3)
        assert source.pinned_blocks == 3
    assert progress.waits == 2
    source.check_invariants()


async def test_open_pull_answers_not_yet_once_its_follow_has_passed() -> None:
    progress = Steps(SEQ[40:])
    source = source_with(progress)
    pull = await open_pull(source, following(SEQ[40:44], follow_ms=1), SESSION)  # no step ever comes
    assert (pull.header.status, pull.header.found, source.pinned_blocks) == (Status.NOT_YET, 0, 0)


async def until_waits(progress: Steps, n: int) -> None:
    """Let the loop run until the pull has begun its `n`-th wait for a step (it runs on this loop)."""
    while progress.waits < n:
        await asyncio.sleep(0)
