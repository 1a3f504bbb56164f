"""ExternalFleet: vLLM/SGLang engines behind the router, each one a node.

For each engine it starts an ExternalEngine (its KV events into the metadata service, its /metrics
as heartbeated load) and makes the EngineAgentClient the router's directory holds, wired so the
realized hits of requests served through the router reach the engine's heartbeats and its ingestion
metrics join its /metrics. Run it in the router's process (the hits cross no process boundary).

    fleet = ExternalFleet(configs, lambda node: MetadataClient(target, credentials=...))
    for client in await fleet.start():
        directory.add(client)
    ...
    await fleet.stop()
"""

from collections.abc import Callable, Sequence

from radixmesh.cluster.fleet.engine_client import EngineAgentClient
from radixmesh.cluster.fleet.ingest.external_engine import ExternalEngine, ExternalEngineConfig
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.proto.ids import NodeId


class ExternalFleet:
    """`metadata_for(node)` makes the node's own metadata client (node credentials), or is None to
    keep the engines out of the index (their clients still serve)."""

    def __init__(self, configs: Sequence[ExternalEngineConfig],
                 metadata_for: Callable[[NodeId], MetadataClient] | None) -> None:
        names = [c.node_id for c in configs]
        if len(set(names)) != len(names):
            raise ValueError(f"engine node ids must be distinct, got {names}")
        self.engines = {c.node_id: ExternalEngine(c, metadata_for(c.node_id) if metadata_for else None)
                        for c in configs}
        self.clients = {
            node: EngineAgentClient(e.config, on_hits=e.node.record_hits, extra_metrics=e.prometheus_text)
            for node, e in self.engines.items()
        }

    async def start(self) -> list[EngineAgentClient]:
        """Start following every engine; the clients to add to the router's directory."""
        started: list[ExternalEngine] = []
        try:
            for engine in self.engines.values():
                await engine.start()
                started.append(engine)
        except BaseException:
            for engine in started:
                await engine.stop()
            raise
        return list(self.clients.values())

    async def stop(self) -> None:
        for engine in self.engines.values():
            await engine.stop()
        for client in self.clients.values():
            await client.close()
