"""Backoff: the pause before retrying after consecutive failures, doubling from `initial_s` up to
`max_s`. The one schedule of the retry loops: a supervised task's restarts (cluster.fleet) and the
event publisher's rounds while the metadata service fails (common.metadata)."""

from dataclasses import dataclass

_MAX_DOUBLINGS = 1000
"""Bounds the exponent only so that 2.0 ** n cannot overflow; any real schedule is at `max_s` long before."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Pauses before retries: doubling per consecutive failure, from `initial_s` up to `max_s`."""

    initial_s: float = 0.1
    """Pause after the first failure."""
    max_s: float = 10.0
    """Longest pause."""

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got initial_s={self.initial_s}, max_s={self.max_s}")

    def pause(self, failures: int) -> float:
        """The pause after `failures` consecutive failures (1: the first): initial_s * 2 ** (failures - 1),
        at most max_s."""
        assert failures >= 1, failures
        return min(self.max_s, self.initial_s * 2.0 ** min(failures - 1, _MAX_DOUBLINGS))
