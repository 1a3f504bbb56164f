"""Zone and physical-memory metrics: one ZoneStats per zone (labelled `zone`) and one PhysicalStats
per node, rendered by metrics_exposition.render_prometheus next to the tiers' MemoryStats."""

import math
from dataclasses import dataclass

from radixmesh.common.metrics.exposition import metric
from radixmesh.node_agent.memory.physical import DeviceMemory
from radixmesh.node_agent.memory.zones.governor import ZoneGovernor


@dataclass(frozen=True, slots=True)
class ZoneStats:
    """One zone at one instant."""

    zone: str
    zone_allotted_bytes: int = metric("gauge", "Bytes allotted to the zone (base + borrowed - lent).")
    zone_used_bytes: int = metric("gauge", "Bytes the zone uses (activations: the last step's peak).")
    zone_watermark: float = metric("gauge", "used / allotted (0 when nothing is allotted or used).")
    zone_borrowed_bytes: int = metric("gauge", "Bytes borrowed from other zones now.")
    zone_lent_bytes: int = metric("gauge", "Bytes lent to other zones now.")
    zone_borrows: int = metric("counter", "Borrow moves made by the zone.")
    zone_returns: int = metric("counter", "Return moves by the zone (loans returned or recalled).")


@dataclass(frozen=True, slots=True)
class PhysicalStats:
    """What the process and the device hold, next to the pool's logical state."""

    process_resident_bytes: int = metric("gauge", "Resident set of the agent's process, in bytes.")
    device_memory_free_bytes: int = metric("gauge", "Free bytes on the agent's device (0 on the CPU).")
    device_memory_total_bytes: int = metric("gauge", "Total bytes of the agent's device (0 on the CPU).")
    activation_peak_bytes: int = metric("gauge", "Largest activation peak of one forward step, measured.")


def zone_stats(governor: ZoneGovernor) -> list[ZoneStats]:
    out = []
    for z in governor.budget.zones.values():
        w = z.watermark
        out.append(ZoneStats(zone=z.name.value, zone_allotted_bytes=z.allotted, zone_used_bytes=z.used,
                             zone_watermark=w if math.isfinite(w) else 1.0, zone_borrowed_bytes=z.borrowed,
                             zone_lent_bytes=z.lent, zone_borrows=z.borrows, zone_returns=z.returns))
    return out


def physical_stats(resident: int, device: DeviceMemory, activation_peak: int) -> PhysicalStats:
    return PhysicalStats(process_resident_bytes=resident, device_memory_free_bytes=device.free_bytes,
                         device_memory_total_bytes=device.total_bytes, activation_peak_bytes=activation_peak)
