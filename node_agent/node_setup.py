"""Building a node's parts from its AgentConfig: the engine (place and load the model, or model its
forward, then size the tiers: host from a byte budget, gpu from a measured memory budget) and the
transfer plane's settings."""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple

import torch

from radixmesh.common.block_pool.config import PoolHooks
from radixmesh.node_agent.config import AgentConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.gpu_budget import measure_gpu_budget
from radixmesh.node_agent.model.base import CausalLM
from radixmesh.node_agent.placement import place_model, set_torch_threads
from radixmesh.node_agent.transfer.client import PullConfig
from radixmesh.node_agent.transfer.handshake import NodeIdentity
from radixmesh.node_agent.transfer.plane import TransferConfig
from radixmesh.proto.kv_layout import KVLayout

logger = logging.getLogger(__name__)


class BuiltEngine(NamedTuple):
    engine: Engine
    device: torch.device
    threads: int
    """CPU threads torch computes with."""


async def build_engine(config: AgentConfig, clock: Callable[[], float], gpu_hooks: PoolHooks | None) -> BuiltEngine:
    """The engine `config` describes, built off the event loop; ValueError when the gpu budget leaves
    no room for a KV block."""
    source, modeled = config.model, config.modeled
    placement = place_model("cpu" if modeled else config.device, config.dtype)
    threads = set_torch_threads()
    model: CausalLM
    identity = await asyncio.to_thread(source.identity)
    tokenizer = await asyncio.to_thread(source.tokenizer)
    if modeled is None:
        model = await asyncio.to_thread(source.load, dtype=placement.dtype, device=placement.device)
    else:  # the seam: only the forward is modeled (model.modeled); its KV never meets a real one's
        model, identity = modeled.model(source.config, source.seed, tokenizer), f"{modeled.label}-{identity}"
    engine_config = replace(config.engine, model_id=identity,
                            eos_token_ids=source.eos_token_ids(),
                            memory=replace(config.engine.memory, disk=config.disk))
    if config.host_cache_bytes:  # a size in bytes: the model's KV bytes per block make it blocks
        layout = model.config.kv_layout(identity, engine_config.block_size,
                                        str(next(model.parameters()).dtype).removeprefix("torch."))
        host_blocks = config.host_blocks_of(layout.block_bytes if modeled is None
                                            else modeled.wire_block_bytes(layout.block_size))
        engine_config = replace(engine_config, memory=replace(engine_config.memory, num_host_blocks=host_blocks))
    if config.gpu_memory_utilization is not None:
        budget = await asyncio.to_thread(measure_gpu_budget, model, engine_config, placement.device,
                                         config.gpu_memory_utilization)
        if budget.num_blocks < 1:
            raise ValueError(f"agent {config.node_id}: no room for KV blocks: {budget.describe()}")
        logger.info("agent %s gpu tier: %s", config.node_id, budget.describe())
        engine_config = replace(engine_config, memory=replace(engine_config.memory, num_gpu_blocks=budget.num_blocks))
    engine = Engine(model, engine_config, device=placement.device, clock=clock, tokenizer=tokenizer,
                    gpu_hooks=gpu_hooks)
    return BuiltEngine(engine, placement.device, threads)


def transfer_config(config: AgentConfig, layout: KVLayout) -> TransferConfig:
    """The transfer plane's settings in `config`; a modeled engine's pulls count and pace its wire bytes."""
    pull = PullConfig(timeout_s=config.pull_timeout_s, mac=config.transfer_mac)
    if config.modeled is not None:
        pull = replace(pull, wire_block_bytes=config.modeled.wire_block_bytes(layout.block_size),
                       wire_gbps=config.modeled.wire_gbps)
    return TransferConfig(config.transfer, NodeIdentity(config.secret, config.node_id), config.host,
                          config.transfer_port, config.handoff, pull)
