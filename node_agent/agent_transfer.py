"""The agent's end of the KV transfer plane: a TransferServer serving its gpu tier and a TransferClient
pulling into it, with every pool/cache touch run through the agent's engine thread (`serial`)."""

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from radixmesh.node_agent.agent_config import AgentConfig
from radixmesh.node_agent.block_hash import BlockHash
from radixmesh.node_agent.ids import BlockId, NodeId
from radixmesh.node_agent.kv_layout import KVLayout
from radixmesh.node_agent.paged_memory import TierMemory
from radixmesh.node_agent.transfer_client import PullOutcome, Serial, TransferClient, TransferConfig
from radixmesh.node_agent.transfer_server import TransferServer
from radixmesh.node_agent.transfer_source import TransferSource
from radixmesh.node_agent.transfer_stats import PeerStats
from radixmesh.node_agent.transport import Peer, transport_by_name

logger = logging.getLogger(__name__)


def parse_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port"; ValueError otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"transfer address must be host:port, got {address!r}")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class Pulled:
    """What one planned pull delivered: `block_ids[i]` holds `hashes[i]`, one reference each, ours."""

    hashes: tuple[BlockHash, ...]
    block_ids: tuple[BlockId, ...]
    nbytes: int
    seconds: float
    failed: bool
    """Fewer blocks arrived than were asked for (the rest are recomputed)."""

    @classmethod
    def nothing(cls, failed: bool = False) -> "Pulled":
        return cls((), (), 0, 0.0, failed)


class AgentTransfer:
    """Serves pulls of the tier's cached blocks and pulls peers' blocks into it (UCX)."""

    def __init__(self, tier: TierMemory, layout: KVLayout, config: AgentConfig, serial: Serial, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._config = config
        loopback = config.host.startswith("127.")
        source = TransferSource(tier.cache, tier.kv, layout, config.cluster_token)
        self._server = TransferServer(source, config.host, config.transfer_port, loopback=loopback,
                                      serial=serial)
        client_config = TransferConfig(config.cluster_token, timeout_s=config.pull_timeout_s)
        self._client = TransferClient(tier.cache, tier.kv, layout, client_config, transport_by_name("ucx"),
                                      clock=clock, serial=serial)
        self.address = ""

    async def start(self) -> None:
        port = await self._server.start()
        self.address = f"{self._config.host}:{port}"

    async def stop(self) -> None:
        await self._client.close()
        await self._server.stop()

    async def pull(self, peer: NodeId, address: str, hashes: list[BlockHash], parent: BlockHash | None) -> Pulled:
        """Pull `hashes` (a run of one prompt's blocks after `parent`) from `peer`; never raises for a
        peer's fault: what did not arrive intact is reported missing."""
        host, port = parse_address(address)
        result = await self._client.pull(Peer(peer, host, port), hashes, parent)
        failed = result.blocks < len(hashes) or result.outcome is not PullOutcome.OK
        if failed:
            logger.info("pull of %d blocks from %s delivered %d (%s)", len(hashes), peer, result.blocks,
                        result.outcome)
        return Pulled(tuple(result.hashes), tuple(result.block_ids), result.nbytes, result.seconds, failed)

    def peer_stats(self) -> Mapping[NodeId, PeerStats]:
        return self._client.stats

    def peer_gbps(self) -> dict[str, float]:
        """Measured pull bandwidth by peer (GB/s), for heartbeats."""
        return {peer: s.ewma_gbps for peer, s in self._client.stats.items() if s.ewma_gbps > 0}
