"""Where an agent's model runs and in which precision: the CUDA device its Ray actor was given (Ray
sets CUDA_VISIBLE_DEVICES, so it is cuda:0 inside the actor), else the CPU."""

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, slots=True)
class DevicePlacement:
    device: torch.device
    dtype: torch.dtype


def place_model(device: str = "auto", dtype: str = "auto") -> DevicePlacement:
    """`device`: "auto" (cuda when this process sees a GPU, else cpu), "cpu" or "cuda[:i]";
    `dtype`: "auto" (bfloat16 on a GPU, float32 on the CPU, where bf16 matmuls are slow) or one of
    DTYPES. ValueError for anything else, or for cuda without a GPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda[:i], got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda asked for, but this process sees no GPU")
    if dtype == "auto":
        return DevicePlacement(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    return DevicePlacement(dev, DTYPES[dtype])
