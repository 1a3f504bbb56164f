"""How many KV blocks an agent's gpu tier gets from `--gpu-memory-utilization`, sized as vLLM sizes
its KV cache: this agent's share of the device's memory, less the weights and the activation peak of
the largest step (measured by running one), divided by a block's bytes.

Several agents may share one GPU (Ray's fractional `num_gpus`): each one's share is its utilization
of the whole device, and no agent takes more than what is free when it starts.
"""

from dataclasses import dataclass, replace

import torch

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.model.base import CausalLM
from radixmesh.proto.serve.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class GpuBudget:
    """What the sizing saw, kept so that the agent can say why its pool has the size it has."""

    total_bytes: int
    free_bytes: int
    """Free on the device after the weights and the profiling step (other processes' use excluded)."""
    utilization: float
    weights_bytes: int
    activation_peak_bytes: int
    block_bytes: int

    @property
    def kv_bytes(self) -> int:
        share = int(self.total_bytes * self.utilization) - self.weights_bytes - self.activation_peak_bytes
        return max(0, min(share, self.free_bytes))

    @property
    def num_blocks(self) -> int:
        return self.kv_bytes // self.block_bytes

    def describe(self) -> str:
        gib = 1 << 30
        return (f"{self.num_blocks} KV blocks ({self.kv_bytes / gib:.2f} GiB) = {self.utilization:.0%} of "
                f"{self.total_bytes / gib:.1f} GiB - weights {self.weights_bytes / gib:.2f} GiB - activation "
                f"peak {self.activation_peak_bytes / gib:.2f} GiB (free {self.free_bytes / gib:.1f} GiB)")


def measure_gpu_budget(model: CausalLM, config: EngineConfig, device: torch.device,
                       utilization: float) -> GpuBudget:
    """Run one full-budget prefill step on a scratch pool and size the gpu tier from what it used.
    `model` is already on `device`. ValueError off a GPU (the CPU tier is sized in blocks)."""
    if device.type != "cuda":
        raise ValueError("gpu_memory_utilization sizes a GPU's memory, and this agent runs on the CPU: "
                         "size its pool with gpu blocks instead")
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    weights = torch.cuda.memory_allocated(device)
    limits = model.config.prompt_limits()
    tokens = min(config.max_num_batched_tokens, limits.max_context_tokens - 1)
    scratch_blocks = -(-(tokens + 1) // config.block_size)
    # No disk tier either: the scratch engine must not open (and lock) the agent's directory.
    memory = replace(config.memory, num_gpu_blocks=scratch_blocks, num_host_blocks=0, enable_prefix_caching=False,
                     disk=None)
    scratch = Engine(model, replace(config, memory=memory), device=device)
    pool = torch.cuda.memory_allocated(device) - weights
    torch.cuda.reset_peak_memory_stats(device)
    scratch.generate([Request(RequestId("profile"), (0,) * tokens, SamplingParams(max_tokens=1, ignore_eos=True))])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - weights - pool
    block_bytes = scratch.layout.block_bytes
    del scratch
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return GpuBudget(total, free, utilization, weights, max(0, peak), block_bytes)
