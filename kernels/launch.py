"""Facts about where a Triton kernel will run, shared by the launchers."""

import torch
import triton

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def on_interpreter() -> bool:
    """True when TRITON_INTERPRET=1 made @triton.jit run kernels as Python on CPU tensors."""
    return bool(triton.knobs.runtime.interpret)


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot` input precision: exact float32 products ("ieee") for float32, tensor cores otherwise.

    float32 caches exist for CPU-equivalent results; TF32 would cost them their accuracy.
    """
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"Triton attention takes {[str(d) for d in _FLOAT_DTYPES]}, got {dtype}")
    return "ieee" if dtype == torch.float32 else "tf32"


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors to fill (1 on the interpreter, which runs programs one by one)."""
    if device.type != "cuda":
        return 1
    return int(torch.cuda.get_device_properties(device).multi_processor_count)
