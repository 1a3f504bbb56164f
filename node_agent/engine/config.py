"""How one node engine batches and where its KV lives: its settings, apart from the engine so that
the launcher and the router read them without loading torch."""

from dataclasses import dataclass, field

from radixmesh.node_agent.memory.config import MemoryConfig


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How one node engine batches and where its KV lives."""

    block_size: int = 16
    max_num_batched_tokens: int = 512
    """Token budget of one step: decode tokens plus prefill chunks."""
    max_num_seqs: int = 64
    """Running sequences at most."""
    preemption: str = "cost"
    """Preemption policy: "cost" (swap or recompute, whichever is estimated cheaper), "swap", "recompute"."""
    keep_logits: bool = False
    """Return every sampled position's logits in RequestOutput (exactness tests)."""
    model_id: str = "seed-0"
    """Names the weights in the KV layout fingerprint."""
    eos_token_ids: tuple[int, ...] = ()
    """More end-of-sequence ids (generation_config.json may list several); the model config's
    eos_token_id always ends a sequence too."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
