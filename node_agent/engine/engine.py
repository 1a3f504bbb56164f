"""The node engine: requests in, tokens out, KV in the paged pool with prefix reuse and preemption.

`Engine` is a plain synchronous class: `submit` validates and queues, `step` runs one scheduling
round (one forward over its decodes and prefill chunks together), `generate` loops until a batch is done. The
Ray actor drives `step` from its own loop; the transfer plane hands pulled blocks in through
`Request.external_prefix`, or pulls them while the request waits queued (`Request.pending_prefix`,
`land_pull`). Memory moves live in radixmesh.node_agent.memory.node_memory.
"""

import contextlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import torch

from radixmesh.common.block_pool.config import PoolHooks
from radixmesh.common.metrics.exposition import render_prometheus
from radixmesh.common.text.stop_strings import StopText
from radixmesh.common.text.tokenizer import Tokenizer
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.metrics import EngineCounters, EngineStats, engine_stats
from radixmesh.node_agent.engine.preemption import make_preemption_policy
from radixmesh.node_agent.engine.request import Request, RequestId, RequestOutput, RequestStats, SequenceState
from radixmesh.node_agent.engine.sampler import sample, token_logprob
from radixmesh.node_agent.engine.scheduler import ScheduledChunk, Scheduler
from radixmesh.node_agent.memory.node_memory import NodeMemory
from radixmesh.node_agent.memory.sequence import PendingPrefix
from radixmesh.node_agent.model.base import CausalLM
from radixmesh.node_agent.model.llama import AttentionBatch, SeqChunk
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.serve.limits import InvalidRequest, usable_prefix_blocks
from radixmesh.proto.serve.sampling import FinishReason, TokenLogprob, draw_seed
from radixmesh.proto.serve.tokens import HIT_SOURCES


class StepOutput(NamedTuple):
    """What one engine step produced."""

    tokens: list[tuple[RequestId, int, TokenLogprob | None]]
    """(request, token, its log-probabilities if the request asked for them) for every token sampled
    this step, in order."""
    finished: list[RequestOutput]
    """Requests that finished this step (their last token is in `tokens` too)."""


class Engine:
    """Continuous-batching engine of one node over a Llama model (or a modeled one: model.base.CausalLM)
    and the paged KV pool."""

    def __init__(self, model: CausalLM, config: EngineConfig | None = None, *,
                 device: str | torch.device = "cpu", clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, tokenizer: Tokenizer | None = None,
                 gpu_hooks: PoolHooks | None = None) -> None:
        """`clock` times TTFT and decode; `rng` draws the seeds of requests that bring none;
        `tokenizer` decodes the output of requests with stop strings (refused without one);
        `gpu_hooks` are what the gpu pool calls out to as it evicts (PoolHooks)."""
        self.config = config = config or EngineConfig()
        self.model = model
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.layout = model.config.kv_layout(config.model_id, config.block_size, dtype)
        self.counters = EngineCounters()
        self.policy = make_preemption_policy(config.preemption, self.layout.block_bytes)
        self.memory = NodeMemory(self.layout, config.memory, self.counters, self.policy, device=device, clock=clock,
                                 gpu_hooks=gpu_hooks,
                                 weights_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))
        self.scheduler = Scheduler(self.memory, self.policy, config.max_num_batched_tokens, config.max_num_seqs)
        self.device = device
        self._eos = frozenset((model.config.eos_token_id, *config.eos_token_ids))
        self.limits = model.config.prompt_limits()
        """What a prompt must satisfy (the router and the agent check the same before this engine)."""
        self._clock = clock
        self._rng = rng or random.Random()
        self._tokenizer = tokenizer
        self._active: dict[RequestId, SequenceState] = {}
        self.forward_gate: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
        """What a step's forward runs inside: the runner lets the transfer plane's pins in there
        (EngineRunner.call_short), since the forward touches no pool or cache structure."""

    # --- requests ----------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Queue a request. Raises InvalidRequest (nothing taken; an external prefix stays the
        caller's) for an empty or out-of-vocabulary prompt, a context or pool it cannot fit, a
        duplicate id, or an external prefix that is not a run of the prompt's blocks.

        A request with a pending prefix gets its pull's blocks here (PendingPrefix, filled in
        before this returns) and waits in the queue until `land_pull`, without holding up the
        requests behind it."""
        start = self._validate(request)
        seed = request.sampling.seed if request.sampling.seed is not None else draw_seed(self._rng)
        stats = RequestStats(prompt_tokens=len(request.prompt_token_ids), arrival_s=self._clock())
        table = self.memory.new_sequence(request.prompt_token_ids, request.salt, request.prompt_hashes or ())
        seq = SequenceState(request, seed, stats, table)
        if request.sampling.stop:
            assert self._tokenizer is not None, "_validate refuses stop strings without a tokenizer"
            seq.stop_text = StopText.start(self._tokenizer, request.sampling.stop)
        ext = request.external_prefix
        if ext is not None and ext.block_ids:
            self.memory.adopt_external(seq, ext.block_ids, ext.hashes, start)
        if request.pending_prefix is not None:
            self.memory.begin_pull(seq, request.pending_prefix)
        self._active[request.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: RequestId) -> bool:
        """Drop a queued or running request and its blocks; False when it is not active. The blocks
        of a pull it waits for stay held until the pull lands (the transfer may still write them)."""
        seq = self._active.pop(request_id, None)
        if seq is None:
            return False
        if seq in self.scheduler.running:
            self.scheduler.finish(seq)
        else:
            self.scheduler.waiting.remove(seq)
        self.memory.release(seq)
        return True

    def land_pull(self, pull: PendingPrefix, received: int) -> None:
        """The transfer of `pull` (begun by `submit`) ended and writes none of its blocks any more;
        the first `received` arrived intact. They become cached blocks of this node, the rest are
        freed, and its request, when still queued, is admitted from the next step on (the landed
        blocks counted as its remote hits; whatever did not arrive is computed)."""
        self.memory.land_pull(pull, received)

    def computing(self, block: BlockHash) -> bool:
        """Whether a request active here will compute `block`, or land it from its pull: a peer that
        follows this node's prefill (PullRequest.follow_ms) waits for it."""
        return any(block in self.memory.uncomputed_hashes(seq) for seq in self._active.values())

    def sequence(self, request_id: RequestId) -> SequenceState | None:
        """The live state of a queued or running request (None once it finished or was aborted).

        Read-only for callers: the engine mutates it on every step, so read it between steps, on the
        thread that steps the engine.
        """
        return self._active.get(request_id)

    def generate(self, requests: Sequence[Request]) -> list[RequestOutput]:
        """Run `requests` to completion (with whatever else is queued); outputs in request order.
        All requests are validated before any is queued."""
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise InvalidRequest("duplicate request ids in one generate call")
        for r in requests:
            self._validate(r)
        for r in requests:
            self.submit(r)
        done: dict[RequestId, RequestOutput] = {}
        while any(i not in done for i in ids):
            for out in self.step().finished:
                done[out.request_id] = out
        return [done[i] for i in ids]

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # --- the loop ----------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """One scheduling round: one forward over this step's decodes and prefill chunks; returns the
        tokens sampled and the requests that finished."""
        plan = self.scheduler.schedule()
        self.counters.steps += 1
        now = self._clock()
        for c in plan:
            if c.seq.stats.scheduled_s is None:  # queue time is the wait before the first run only
                c.seq.stats.scheduled_s = now
                self.counters.observe_queue_time(now - c.seq.stats.arrival_s)
        out = StepOutput([], [])
        if plan:
            # Decodes first: AttentionBatch runs its leading one-token sequences through the decode kernel.
            self._run([c for c in plan if c.num_tokens == 1] + [c for c in plan if c.num_tokens > 1], out)
        return out

    def _run(self, group: list[ScheduledChunk], out: StepOutput) -> None:
        chunks = [SeqChunk(c.seq.block_ids, c.seq.num_computed, c.num_tokens) for c in group]
        batch, positions = AttentionBatch.build(chunks, self.layout.block_size, self.device)
        ids = [t for c in group for t in c.seq.tokens[c.seq.num_computed: c.seq.num_computed + c.num_tokens]]
        last_rows = (batch.cu_seqlens[1:] - 1).long()
        t0 = self._clock()
        self.memory.begin_forward()
        with self.forward_gate():
            logits = self.model(torch.tensor(ids, device=self.device), positions, batch, self.memory.kv,
                                last_rows).cpu()
        self.memory.end_forward()
        if not batch.is_decode:
            # Decodes riding along cost what prefill tokens cost in the linear layers: count them all.
            self.policy.observe_prefill(len(ids), self._clock() - t0)
        for row, (seq, n) in enumerate(group):
            seq.num_computed += n
            seq.stats.forward_tokens += n
            self.counters.computed_tokens += n
            self.memory.insert_computed(seq)
            if seq.num_uncomputed == 0 and seq.request.prefill_only:
                out.finished.append(self._finish(seq, FinishReason.PREFILLED))
            elif seq.num_uncomputed == 0:
                token, reason = self._append_token(seq, logits[row])
                logprob = seq.logprobs[-1] if seq.request.sampling.logprobs is not None else None
                out.tokens.append((seq.request.request_id, token, logprob))
                if reason is not None:
                    out.finished.append(self._finish(seq, reason))

    def _append_token(self, seq: SequenceState, logits: torch.Tensor) -> tuple[int, FinishReason | None]:
        params = seq.request.sampling
        index = len(seq.output_token_ids)
        token = sample(logits, params, seq.seed, index)
        seq.tokens.append(token)
        if params.logprobs is not None:
            seq.logprobs.append(token_logprob(logits, token, params.logprobs))
        self.counters.generated_tokens += 1
        if self.config.keep_logits:
            seq.logits.append(logits.clone())
        now = self._clock()
        if index == 0:
            seq.stats.first_token_s = now
            self.counters.observe_ttft(now - seq.stats.arrival_s)
        else:
            assert seq.stats.last_token_s is not None, "a later token follows an earlier one"
            self.counters.observe_inter_token(now - seq.stats.last_token_s)
        seq.stats.last_token_s = now
        if token in params.stop_token_ids or (token in self._eos and not params.ignore_eos):
            return token, FinishReason.STOP
        if seq.stop_text is not None and seq.stop_text.push(token):
            return token, FinishReason.STOP
        if index + 1 >= params.max_tokens:
            return token, FinishReason.LENGTH
        return token, None

    def _finish(self, seq: SequenceState, reason: FinishReason) -> RequestOutput:
        self.memory.release(seq)
        self.scheduler.finish(seq)
        del self._active[seq.request.request_id]
        seq.stats.finish_s = self._clock()
        c = self.counters
        c.prompt_tokens += seq.stats.prompt_tokens
        assert seq.stats.sources is not None, "a finished request was admitted"
        for source in HIT_SOURCES:
            c.count(c.cached_tokens, source, getattr(seq.stats.sources, source))
        c.count(c.finished, reason.value)
        return RequestOutput(
            request_id=seq.request.request_id,
            prompt_token_ids=seq.request.prompt_token_ids,
            output_token_ids=tuple(seq.output_token_ids),
            finish_reason=reason,
            stats=seq.stats,
            logits=tuple(seq.logits) if self.config.keep_logits else None,
            logprobs=tuple(seq.logprobs),
        )

    # --- validation, invariants, metrics -----------------------------------------------------
    def _validate(self, request: Request) -> int:
        """Raise InvalidRequest for a request that cannot be served; returns the block index where
        its external prefix starts (0 without one)."""
        prompt = request.prompt_token_ids
        if request.request_id in self._active:
            raise InvalidRequest(f"request id {request.request_id!r} is already active")
        self.limits.check(prompt, request.sampling.max_tokens)
        given = request.prompt_hashes
        if given is not None and len(given) != len(prompt) // self.layout.block_size:
            raise InvalidRequest(f"{len(given)} prompt hashes for {len(prompt) // self.layout.block_size} full blocks")
        if request.sampling.stop and self._tokenizer is None:
            raise InvalidRequest("stop strings need the engine's tokenizer, and this engine has none")
        total = len(prompt) + request.sampling.max_tokens
        need = self.memory.blocks_for(total)
        if need > self.memory.num_gpu_blocks:
            raise InvalidRequest(f"prompt + max_tokens needs {need} blocks, the whole pool has "
                                 f"{self.memory.num_gpu_blocks}")
        ext = request.external_prefix
        pull = request.pending_prefix
        if pull is not None:
            if ext is not None:
                raise InvalidRequest("a request brings its external prefix or pulls it, not both")
            usable = usable_prefix_blocks(len(prompt), self.layout.block_size)
            if pull.block_ids or not 0 <= pull.end_block <= usable:
                raise InvalidRequest(f"a pending prefix must be fresh and end within the prompt's {usable} "
                                     f"usable blocks, got end_block {pull.end_block}")
        if ext is None or not ext.block_ids:
            return 0
        if not self.memory.holds_external(ext.block_ids, ext.hashes):
            raise InvalidRequest("external prefix blocks must be distinct gpu blocks held by the caller "
                                 "and not cached under another hash")
        hashes = list(given) if given is not None else self.memory.hash_prompt(prompt, request.salt)
        try:
            start = hashes.index(ext.hashes[0])
        except ValueError:
            raise InvalidRequest("external prefix does not start at a block of this prompt") from None
        if list(ext.hashes) != hashes[start: start + len(ext.hashes)]:
            raise InvalidRequest("external prefix hashes are not a contiguous run of the prompt's blocks")
        return start

    def check_invariants(self) -> None:
        """Memory's invariants (every reference held on a block is a live sequence's, so a finished or
        preempted request can leak nothing), and every active sequence is queued or running."""
        seqs = list(self._active.values())
        self.memory.check_invariants(seqs)
        queued = len(self.scheduler.waiting) + len(self.scheduler.running)
        assert queued == len(seqs), f"{queued} queued sequences, {len(seqs)} active"

    def stats(self) -> EngineStats:
        c = self.counters
        c.preemptions = {m.value: n for m, n in self.scheduler.num_preemptions.items()}
        return engine_stats(c, len(self.scheduler.running), len(self.scheduler.waiting))

    def prometheus_text(self, labels: Mapping[str, str] | None = None) -> str:
        """Memory metrics of every tier and zone plus the engine's, in one Prometheus exposition,
        every sample labelled with `labels` too."""
        return render_prometheus([*self.memory.stats_snapshots(), self.stats()], labels)
