"""The node agent: one per GPU, it serves requests with its engine, keeps their KV blocks in its
prefix cache, publishes what it caches and pulls what its peers cache.

This module is node_agent's public face: the cluster layer (launch and cli: the contract
`cluster-uses-node-agent-face` in pyproject) imports these names from here and nothing from the
submodules. The names load on first use (PEP 562), so a command that needs only a model name does
not import torch and Ray with the engine. (The block pool and prefix cache are common's.)
"""

import importlib
from typing import TYPE_CHECKING, Any

from radixmesh.import_name import step_aside

step_aside(__name__)  # importable only as radixmesh.node_agent (radixmesh/import_name.py)

if TYPE_CHECKING:
    from radixmesh.node_agent.actor import AgentPlacement, make_agent_actor, node_resource
    from radixmesh.node_agent.config import TRANSFER_PLANES, AgentConfig
    from radixmesh.node_agent.engine.config import EngineConfig
    from radixmesh.node_agent.engine.virtual_node import VirtualNode, VirtualPull, VirtualStep
    from radixmesh.node_agent.memory.config import MemoryConfig
    from radixmesh.node_agent.model.config import NAMED_CONFIGS
    from radixmesh.node_agent.model.modeled.profile import ProfileError, load_profile, profile_names
    from radixmesh.node_agent.model.modeled.spec import ModeledEngine, parse_engine
    from radixmesh.node_agent.model.source import SMOLLM2, ModelSource, random_source, resolve_model
    from radixmesh.node_agent.transfer.ucx_env import ucx_env

_HOMES = {
    "AgentPlacement": "actor", "make_agent_actor": "actor", "node_resource": "actor",
    "TRANSFER_PLANES": "config", "AgentConfig": "config",
    "EngineConfig": "engine.config",
    "VirtualNode": "engine.virtual_node", "VirtualPull": "engine.virtual_node", "VirtualStep": "engine.virtual_node",
    "MemoryConfig": "memory.config",
    "NAMED_CONFIGS": "model.config",
    "ProfileError": "model.modeled.profile", "load_profile": "model.modeled.profile",
    "profile_names": "model.modeled.profile",
    "ModeledEngine": "model.modeled.spec", "parse_engine": "model.modeled.spec",
    "SMOLLM2": "model.source", "ModelSource": "model.source", "random_source": "model.source",
    "resolve_model": "model.source",
    "ucx_env": "transfer.ucx_env",
}

__all__ = [  # the names of _HOMES, spelled out so linters and type checkers see the re-exports
    "NAMED_CONFIGS",
    "SMOLLM2",
    "TRANSFER_PLANES",
    "AgentConfig",
    "AgentPlacement",
    "EngineConfig",
    "MemoryConfig",
    "ModelSource",
    "ModeledEngine",
    "ProfileError",
    "VirtualNode",
    "VirtualPull",
    "VirtualStep",
    "load_profile",
    "make_agent_actor",
    "node_resource",
    "parse_engine",
    "profile_names",
    "random_source",
    "resolve_model",
    "ucx_env",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
