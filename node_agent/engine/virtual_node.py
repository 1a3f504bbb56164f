"""A node on a virtual clock: the agent's own Engine over the modeled forward, for the engine simulator
(radixmesh.cluster.bench.engine_sim).

The modeled forward waits its step's time by `sleep`; here that moves the node's clock instead of the
wall's, so a step runs at once and says how long it took. The engine is built as an agent builds a
modeled one (node_setup.build_engine: the agent's EngineConfig, the model's identity and
end-of-sequence ids, the profile's pool), and its steps measure the step floor and prefill rate the
agent would heartbeat (StepRates). A request is queued as the agent queues a routed plan: greedy,
ignore_eos, its pull's blocks allocated to land later (a PendingPrefix).
"""

from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine, StepOutput
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.engine.step_rates import StepRates
from radixmesh.node_agent.memory.sequence import PendingPrefix
from radixmesh.node_agent.model.modeled.spec import ModeledEngine
from radixmesh.node_agent.model.source import ModelSource
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.events import CacheEvent, Tier
from radixmesh.proto.metadata.nodes import NodeLoad
from radixmesh.proto.serve.sampling import SamplingParams
from radixmesh.proto.serve.tokens import TokenSources


class VirtualStep(NamedTuple):
    seconds: float
    """Virtual seconds the step took (the modeled forward's wait)."""
    tokens: list[str]
    """Request ids that got a token, in the step's order."""
    finished: list[str]
    """Request ids that finished."""
    sources: dict[str, TokenSources]
    """Where the prompt of each request that got its first token, or finished its prefill-only run,
    came from."""


class VirtualPull(NamedTuple):
    """The blocks a queued request waits for from a peer (landed with `VirtualNode.land`)."""

    prefix: PendingPrefix
    start: int
    """The first prompt block to pull (those before it are cached here)."""
    blocks: int
    """Blocks allocated for it (past what fits, the prompt is computed)."""


class VirtualNode:
    def __init__(self, engine_config: EngineConfig, modeled: ModeledEngine, source: ModelSource, seed: int = 0) -> None:
        self.t = 0.0
        """The node's clock: the simulator's time at each call, moved on by each step's wait."""
        tokenizer = source.tokenizer()
        model = modeled.model(source.config, source.seed, tokenizer, clock=self._clock, sleep=self._wait)
        config = replace(engine_config, model_id=f"{modeled.label}-{source.identity()}",
                         eos_token_ids=source.eos_token_ids())
        self.engine = Engine(model, config, clock=self._clock, tokenizer=tokenizer)
        self.layout = self.engine.layout.fingerprint()
        self.wire_block_bytes = modeled.wire_block_bytes(config.block_size)
        """The KV bytes a block stands for on the profile's link (what a pull of it moves)."""
        self.rates = StepRates()
        self._seed = seed
        self.handed_off_blocks = 0
        """Blocks demoted after delivered pulls, in total (TransferSource.handed_off_blocks)."""
        self._first: set[str] = set()
        """Requests that have had their first token."""

    def _clock(self) -> float:
        return self.t

    def _wait(self, seconds: float) -> None:
        self.t += seconds

    def hashes(self, prompt: Sequence[int]) -> list[BlockHash]:
        """The prompt's block hashes as the router and this node's engine compute them."""
        return self.engine.memory.hash_prompt(prompt, b"")

    def submit(self, now: float, request_id: str, prompt: tuple[int, ...], max_tokens: int,
               hashes: Sequence[BlockHash], pull_end_block: int = 0, prefill_only: bool = False) -> VirtualPull | None:
        """Queue a request at `now` (`prefill_only`: a split request's prefill phase, which finishes
        without a token); with `pull_end_block`, its prompt blocks up to there that this node lacks are
        to be pulled: the VirtualPull to `land` (None when there is nothing to pull)."""
        self.t = now
        prefix = PendingPrefix(pull_end_block) if pull_end_block else None
        sampling = SamplingParams(max_tokens=1 if prefill_only else max_tokens, ignore_eos=True, seed=self._seed)
        self.engine.submit(Request(RequestId(request_id), prompt, sampling, prompt_hashes=tuple(hashes),
                                   pending_prefix=prefix, prefill_only=prefill_only))
        if prefix is None or not prefix.block_ids:
            return None
        return VirtualPull(prefix, prefix.start, len(prefix.block_ids))

    def land(self, now: float, pull: VirtualPull, received: int) -> None:
        """The first `received` blocks of `pull` arrived."""
        self.t = now
        self.engine.land_pull(pull.prefix, received)

    def held_prefix(self, hashes: Sequence[BlockHash]) -> int:
        """Leading blocks of `hashes` cached in the gpu tier (what a pull from this node gets)."""
        return self.engine.memory.cached_prefix(Tier.GPU, hashes)

    def hand_off(self, hashes: Sequence[BlockHash]) -> int:
        """A peer received these blocks from this node (a delivered pull, hand-off on): as the agent's
        transfer source closes such a pull, the ones still cached are pinned, released and sent to
        the front of the eviction order (TransferSource._release). Returns how many were demoted."""
        cache = self.engine.memory.gpu.cache
        blocks = cache.match(hashes)
        cache.release(blocks)
        demoted = cache.demote(blocks)
        self.handed_off_blocks += demoted
        return demoted

    def take_events(self) -> list[CacheEvent]:
        """The cache events since the last call (what the agent publishes to the index)."""
        return self.engine.memory.take_events()

    def step(self, now: float) -> VirtualStep | None:
        """Run one step at `now`; None when there is nothing it can run (idle, or only requests waiting
        for their pulls), as the agent's runner then waits instead of stepping."""
        if not self.engine.has_work:
            return None
        self.t = now
        counters = self.engine.counters
        computed, running = counters.computed_tokens, len(self.engine.scheduler.running)
        output = self.engine.step()
        if self.engine.scheduler.idle:
            return None
        seconds = self.t - now
        self.rates.measure(counters.computed_tokens - computed, running, seconds)
        tokens = [str(rid) for rid, _, _ in output.tokens]
        return VirtualStep(seconds, tokens, [str(o.request_id) for o in output.finished], self._sources(tokens, output))

    def _sources(self, tokens: list[str], output: StepOutput) -> dict[str, TokenSources]:
        done = {str(o.request_id): o for o in output.finished}
        sources: dict[str, TokenSources] = {}
        for rid in tokens:
            if rid in self._first:
                continue
            self._first.add(rid)
            seq = self.engine.sequence(RequestId(rid))
            found = done[rid].stats.sources if rid in done else seq.stats.sources if seq is not None else None
            assert found is not None, "a request that gave a token was admitted"
            sources[rid] = found
        for rid, out in done.items():
            self._first.discard(rid)
            if rid not in tokens and out.stats.sources is not None:  # prefill-only: done without a token
                sources[rid] = out.stats.sources
        return sources

    def load(self) -> NodeLoad:
        """What the node's heartbeat would say (NodeAgent.load of a modeled agent: no compute group,
        no pull measured per peer): its queue, running tokens, free blocks and measured prices."""
        scheduler = self.engine.scheduler
        return NodeLoad(queued_requests=len(scheduler.waiting),
                        running_tokens=sum(len(s.tokens) for s in scheduler.running),
                        free_blocks=self.engine.memory.free_blocks,
                        prefill_tokens_per_s=self.rates.prefill_tokens_per_s, step_floor_s=self.rates.step_floor_s)
