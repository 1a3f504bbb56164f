"""Where an agent's model runs and in which precision: the CUDA device its Ray actor was given (Ray
sets CUDA_VISIBLE_DEVICES, so it is cuda:0 inside the actor), else the CPU; and how many CPU threads
torch computes with: the CPUs Ray gave the actor."""

import os
from dataclasses import dataclass

import ray
import torch

from radixmesh.proto.kv_layout import KV_DTYPES


@dataclass(frozen=True, slots=True)
class DevicePlacement:
    device: torch.device
    dtype: torch.dtype


def place_model(device: str = "auto", dtype: str = "auto") -> DevicePlacement:
    """`device`: "auto" (cuda when this process sees a GPU, else cpu), "cpu" or "cuda[:i]";
    `dtype`: "auto" (bfloat16 on a GPU, float32 on the CPU, where bf16 matmuls are slow) or one of
    proto.kv_layout.KV_DTYPES. ValueError for anything else, or for cuda without a GPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda[:i], got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda asked for, but this process sees no GPU")
    if dtype == "auto":
        return DevicePlacement(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if dtype not in KV_DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(KV_DTYPES)}, got {dtype!r}")
    return DevicePlacement(dev, getattr(torch, dtype))


def torch_threads(assigned_cpus: float | None, affinity: int, current: int) -> int:
    """Torch's intra-op threads for an agent that may run on `affinity` CPUs.

    In a Ray actor (`assigned_cpus` not None): the CPUs Ray assigned it, rounded, at least 1, since more
    threads than that would take cores Ray gave to other actors. Outside Ray the agent shares its process
    with whoever embedded it (tests pin torch to one thread), so the process's `current` choice stands.
    Either way no more than `affinity`: threads past the CPUs the process may use only wait for them.
    """
    wanted = current if assigned_cpus is None else round(assigned_cpus)
    return max(1, min(wanted, affinity))


def ray_assigned_cpus() -> float | None:
    """The CPUs Ray assigned to the actor this runs in (0 when it asked for none); None outside an actor."""
    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:
        return None
    return float(context.get_assigned_resources().get("CPU", 0.0))


def set_torch_threads() -> int:
    """Set torch's intra-op threads for this agent (`torch_threads`) and return the number."""
    threads = torch_threads(ray_assigned_cpus(), len(os.sched_getaffinity(0)), torch.get_num_threads())
    torch.set_num_threads(threads)
    return threads
