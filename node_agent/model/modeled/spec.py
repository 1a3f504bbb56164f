"""`--engine real | modeled[:PROFILE]`: which engine an agent runs, and what a modeled one needs."""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixmesh.common.text.tokenizer import Tokenizer
from radixmesh.node_agent.model.config import LlamaConfig
from radixmesh.node_agent.model.modeled.profile import Profile, load_profile
from radixmesh.node_agent.model.modeled.time_model import StepTimeModel

if TYPE_CHECKING:
    from radixmesh.node_agent.model.modeled.forward import ModeledModel

DEFAULT_PROFILE = "h100-llama3-8b"
REAL = "real"


@dataclass(frozen=True, slots=True)
class ModeledEngine:
    """The real agent (pool, cache, scheduler, events, transfer plane) with the forward priced by
    `profile` and its waits divided by `speedup`."""

    profile: Profile
    speedup: float = 1.0
    """Modeled seconds per wall second: 10 runs a modeled minute in six wall seconds (pull wire
    times too), so measured rates are 10x the profile's."""

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ValueError(f"speedup must be > 0, got {self.speedup}")

    @property
    def label(self) -> str:
        """How figures from this engine are labelled: modeled:<profile>."""
        return f"modeled:{self.profile.name}"

    def model(self, config: LlamaConfig, seed: int = 0, tokenizer: Tokenizer | None = None,
              clock: Callable[[], float] = time.perf_counter,
              sleep: Callable[[float], None] = time.sleep) -> "ModeledModel":
        """The modeled forward for a model of `config`, its outputs seeded by `seed` and drawn from
        `tokenizer`'s vocabulary (never its end of sequence nor its stop tokens: a modeled reply is
        max_tokens long). `clock` and `sleep` time each step's wait: wall time on an agent, a
        virtual clock in the engine simulator."""
        # Imported here (it is torch): a ModeledEngine travels inside the launcher's config to the
        # router and the metadata service, which only read its label.
        from radixmesh.node_agent.model.modeled.forward import ModeledModel

        never = frozenset() if tokenizer is None else frozenset(
            {*tokenizer.stop_token_ids, *([] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id])})
        return ModeledModel(config, StepTimeModel(self.profile.figures), speedup=self.speedup, seed=seed,
                            output_vocab=tokenizer.vocab_size if tokenizer is not None else None, never=never,
                            clock=clock, sleep=sleep)

    def wire_block_bytes(self, block_size: int) -> int:
        """The KV bytes one block stands for on the modeled hardware (its pool holds fewer: forward.py)."""
        return block_size * self.profile.figures.kv_bytes_per_token

    @property
    def wire_gbps(self) -> float:
        """The link a pull's wire bytes cross, in wall-clock GB/s (sped up like every wait)."""
        return self.profile.figures.link_gbps * self.speedup

    def gpu_blocks(self, block_size: int) -> int:
        """The pool the profile's device holds, in blocks."""
        return max(1, self.profile.figures.kv_capacity_tokens // block_size)


def parse_engine(spec: str, speedup: float = 1.0) -> ModeledEngine | None:
    """None for "real"; the ModeledEngine of "modeled" (DEFAULT_PROFILE) or "modeled:PROFILE" (a
    packaged profile's name or a .yaml path). ValueError (ProfileError) naming what is valid."""
    if spec == REAL:
        return None
    kind, _, name = spec.partition(":")
    if kind != "modeled" or (_ and not name):
        raise ValueError(f"unknown engine {spec!r}; valid: real, modeled, modeled:PROFILE")
    return ModeledEngine(load_profile(name or DEFAULT_PROFILE), speedup)
