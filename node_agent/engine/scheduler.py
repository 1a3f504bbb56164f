"""Continuous batching: which sequences run this step, with how many tokens, and who is preempted.

The scheduler owns the queues and the policy; the memory moves (matching prefixes, allocating,
swapping) belong to a `BlockSpace`, so the policy is testable on its own and the engine stays the
only place that touches KV tensors.
"""

import logging
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from radixmesh.node_agent.engine.preemption import PreemptionPolicy
from radixmesh.node_agent.engine.request import SequenceState
from radixmesh.node_agent.memory.sequence import PreemptMode
from radixmesh.proto.block_hash import BlockHash

logger = logging.getLogger(__name__)


class BlockSpace(Protocol):
    """The memory moves the scheduler asks for; each is all-or-nothing."""

    def admit(self, seq: SequenceState, budget: int) -> int:
        """Place a waiting sequence (prefix hits, swap-in) and room for its next chunk of at most
        `budget` tokens; returns that chunk's size, or 0 when it does not fit (then nothing is held)."""
        ...

    def grow(self, seq: SequenceState, num_tokens: int) -> bool:
        """Extend the block table to hold `num_tokens` tokens; False (nothing taken) when out of blocks."""
        ...

    def preempt(self, seq: SequenceState, mode: PreemptMode) -> PreemptMode:
        """Give up the sequence's gpu blocks by `mode`; returns the mode used (swap falls back to
        recompute when the host tier is full)."""
        ...

    def uncomputed_hashes(self, seq: SequenceState) -> Sequence[BlockHash]:
        """The hashes of the sequence's full blocks whose KV it has not computed yet: what another
        sequence could hit once it has (none without prefix caching)."""
        ...


class ScheduledChunk(NamedTuple):
    seq: SequenceState
    num_tokens: int


class Scheduler:
    """FCFS continuous batching under a per-step token budget, with chunked prefill.

    Each step serves running sequences first (oldest admission first: they hold blocks and finishing
    them frees memory), then admits waiting ones while budget and room remain. A running sequence
    that cannot grow preempts the most recently admitted running one (possibly itself), which goes
    back to the head of the waiting queue; no admission happens in a step that preempted. A waiting
    sequence whose pull has not landed keeps its place but is passed over, so it never holds up the
    ones behind it; so is one whose prompt shares a block that a running sequence (or one admitted
    earlier in this step) has yet to compute, or a waiting one is pulling: it is admitted once that
    block is computed (or landed) and cached, and hits it instead of computing it a second time beside
    it (SGLang's in-batch prefix caching does the like). Unshared, an agent's next call, sent while its previous call was still prefilling on
    the same node, computed that call's new tokens again: the router's predicted prefill tokens came
    true only within 1.26-1.39x on the agent workload (docs/routing.md#the-cost-model).
    """

    def __init__(self, space: BlockSpace, policy: PreemptionPolicy, max_num_batched_tokens: int,
                 max_num_seqs: int) -> None:
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        self.space = space
        self.policy = policy
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []
        self.num_preemptions: dict[PreemptMode, int] = {m: 0 for m in PreemptMode}
        self.idle = False
        """The last schedule() ran nothing and preempted nobody: until a request arrives, a pull lands
        or blocks are given back, another step would not either (EngineRunner sleeps instead)."""

    def add(self, seq: SequenceState) -> None:
        self.waiting.append(seq)

    def finish(self, seq: SequenceState) -> None:
        """Forget a finished running sequence (its blocks are released by the caller)."""
        self.running.remove(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledChunk]:
        """This step's chunks; each chunk's blocks are allocated by the time it is returned."""
        budget = self.max_num_batched_tokens
        plan: list[ScheduledChunk] = []
        preempted = False
        for seq in list(self.running):
            if budget == 0 or seq not in self.running:
                break
            n = min(seq.num_uncomputed, budget)
            while not self.space.grow(seq, seq.num_computed + n):
                preempted = True
                victim = self.running.pop()
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                plan.append(ScheduledChunk(seq, n))
                budget -= n
        computing: set[BlockHash] | None = None  # built at the first admission a step tries
        while not preempted and budget and len(self.running) < self.max_num_seqs:
            if computing is None:
                computing = {h for seq in self.running for h in self.space.uncomputed_hashes(seq)}
                computing.update(h for seq in self.waiting if seq.pulling is not None for h in seq.pulling.hashes)
            ready = next((s for s in self.waiting if s.pulling is None and (
                s.is_swapped or computing.isdisjoint(self.space.uncomputed_hashes(s)))), None)
            if ready is None:
                break
            n = self.space.admit(ready, budget)
            if n == 0:
                break
            self.waiting.remove(ready)
            self.running.append(ready)
            computing.update(self.space.uncomputed_hashes(ready))
            plan.append(ScheduledChunk(ready, n))
            budget -= n
        self.idle = not plan and not preempted
        return plan

    def _preempt(self, seq: SequenceState) -> None:
        mode = self.policy.choose(len(seq.block_ids), seq.num_computed)
        used = self.space.preempt(seq, mode)
        self.num_preemptions[used] += 1
        seq.stats.preemptions += 1
        self.waiting.appendleft(seq)
        logger.debug("preempted %s by %s", seq.request.request_id, used)
