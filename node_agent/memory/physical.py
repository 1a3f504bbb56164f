"""The physical layer of memory monitoring, next to the pool's logical state: what the process and
the device really hold, and the real activation peak of one forward step.

On a GPU the device's own numbers (`torch.cuda.mem_get_info`, the caching allocator's peak); on the
CPU the process's resident set from /proc (Linux), whose high-water mark the kernel resets on request
(`/proc/self/clear_refs` "5"), so a step's peak is measured, not assumed.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def process_resident_bytes() -> int:
    """The process's resident set (0 where /proc is not readable)."""
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else 0


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """The device's free and total bytes as the driver reports them (both 0 off a GPU)."""

    free_bytes: int
    total_bytes: int


def device_memory(device: torch.device) -> DeviceMemory:
    if device.type != "cuda":
        return DeviceMemory(0, 0)
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(free, total)


class StepPeakMeter:
    """Peak bytes a step allocates beyond what was held when it began: `start()` before the forward
    pass, `stop()` after it. GPU: the caching allocator's peak. CPU: the growth of the resident set's
    high-water mark, which is reset at `start()` (0 where the kernel does not offer the reset).

    Both resets are process-wide: whoever reads the same peak around a longer span sees only what
    came after the last step's start. engine.gpu_budget profiles exactly one forward step, whose
    live tensors the reset keeps (peak := allocated now), so its figure is unchanged. On the CPU the
    figure is a lower bound: memory the allocator reuses without growing the resident set is unseen."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._base = 0
        self._cpu_reset = True

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return
        if self._cpu_reset:
            try:
                _CLEAR_REFS.write_text("5")
            except OSError:
                self._cpu_reset = False  # not Linux, or not allowed: report 0 from now on
        self._base = process_resident_bytes()

    def stop(self) -> int:
        if self.device.type == "cuda":
            return max(0, torch.cuda.max_memory_allocated(self.device) - self._base)
        if not self._cpu_reset:
            return 0
        peak = _status_kib("VmHWM")
        return max(0, peak * 1024 - self._base) if peak is not None else 0
