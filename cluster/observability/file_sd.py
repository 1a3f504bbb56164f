"""The router's Prometheus target list in `file_sd_configs` format: one target per agent that serves
its own /metrics, plus the router, so Prometheus scrapes each and `up` shows each.

    [{"targets": ["10.0.0.1:8000"], "labels": {"role": "router", "availability_zone": "", "__param_scope": "router"}},
     {"targets": ["10.0.0.5:41877"], "labels": {"role": "agent", "availability_zone": "us-east-1a", "node": "node-3"}}]

The zone label is `availability_zone`, not `zone`: memory-zone metrics already label `zone` (kv, prefix).

The router's target asks `/metrics?scope=router`: its own metrics and those of agents that appear in
no target (external engines' ingestion), so no agent sample is scraped twice. The file is replaced
atomically (written aside, then renamed): Prometheus rereads it on change and must never read half.
Next to it, `metrics_token` (0600) holds the bearer token agents off loopback require
(common.metrics.scrape) and `ca.pem` the CAs https targets (agents and a router beyond loopback)
are verified against; deploy/prometheus.yml reads all three.
"""

import asyncio
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from radixmesh.cluster.fleet.agent_client import AgentClient, AgentUnavailable
from radixmesh.cluster.router.router import Router
from radixmesh.common.metrics.scrape import ScrapeTarget
from radixmesh.common.private_files import check_private_folder, replace_atomically

logger = logging.getLogger(__name__)

ROUTER_SCOPE = "router"
"""`/metrics?scope=router`: the router's own metrics and those of agents without a target."""
TARGETS_FILE = "targets.json"
"""The list's file name in the folder `up` writes it to (deploy/prometheus.yml reads both there)."""
TOKEN_FILE = "metrics_token"
CA_FILE = "ca.pem"
"""The CA certificate https targets verify against (Prometheus' tls_config.ca_file), beside the list."""


@dataclass(frozen=True, slots=True)
class FileSdConfig:
    """Where the router writes its target list and how often it refreshes it."""

    path: Path
    """The JSON file Prometheus' file_sd_configs reads."""
    interval_s: float = 5.0
    metrics_token: str | None = None
    """Written to `TOKEN_FILE` beside `path` (0600) for Prometheus' credentials_file; None: not written."""
    ca_certificate: bytes | None = None
    """PEM written to `CA_FILE` beside `path` (public) for Prometheus' tls_config; None: not written."""

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")


def file_sd_groups(targets: Iterable[ScrapeTarget]) -> list[dict[str, object]]:
    """One file-SD group per target, in the order given."""
    groups: list[dict[str, object]] = []
    for t in targets:
        labels = {"role": "router" if t.node is None else "agent", "availability_zone": t.zone}
        if t.node is not None:
            labels["node"] = t.node
        labels.update((f"__param_{k}", v) for k, v in t.params)
        if t.scheme != "http":
            labels["__scheme__"] = t.scheme
        groups.append({"targets": [t.address], "labels": labels})
    return groups


class FileSdPublisher:
    """Keeps `config.path` listing the router and every agent with a /metrics of its own."""

    def __init__(self, router: Router, config: FileSdConfig) -> None:
        self._router = router
        self._config = config
        self._own: ScrapeTarget | None = None
        self._listening = asyncio.Event()
        self._written: list[dict[str, object]] | None = None

    async def listen_at(self, address: str, scheme: str = "http") -> None:
        """The router's HTTP address (host:port) is known: write the list now, refresh it from then on."""
        self._own = ScrapeTarget(address, None, params=(("scope", ROUTER_SCOPE),), scheme=scheme)
        await self.refresh()
        self._listening.set()

    async def refresh(self) -> list[ScrapeTarget]:
        """Ask every agent for its target, rewrite the file if the list changed, and tell the router
        which nodes Prometheus scrapes directly (left out of `scope=router`). The list, router first."""
        assert self._own is not None, "listen_at first"
        directory = self._router.directory
        clients = [c for c in map(directory.get, directory.nodes()) if c is not None]
        answers = await asyncio.gather(*(self._target(c) for c in clients))
        agents = [t for t in answers if t is not None]
        targets = [self._own, *agents]
        groups = file_sd_groups(targets)
        if groups != self._written:
            # Whoever could create names in the folder could plant a link where the token goes (issue 38).
            check_private_folder(self._config.path.parent, create=True)
            if self._written is None and self._config.metrics_token is not None:
                replace_atomically(self._config.path.with_name(TOKEN_FILE), self._config.metrics_token.encode())
            if self._written is None and self._config.ca_certificate is not None:
                replace_atomically(self._config.path.with_name(CA_FILE), self._config.ca_certificate, 0o644)
            replace_atomically(self._config.path, (json.dumps(groups, indent=1) + "\n").encode(), 0o644)
            self._written = groups
            logger.info("Prometheus targets in %s: the router and %d agent(s)", self._config.path, len(agents))
        self._router.scraped_nodes = frozenset(t.node for t in agents if t.node is not None)
        return targets

    async def _target(self, client: AgentClient) -> ScrapeTarget | None:
        try:
            async with asyncio.timeout(self._router.config.match_timeout_s * 4):
                return await client.scrape_target()
        except (AgentUnavailable, TimeoutError) as e:  # listed at the next refresh
            logger.info("scrape target of %s unknown for now: %s", client.node, e)
            return None

    async def run(self) -> None:
        """Refresh every `interval_s` until cancelled (a file that cannot be written is logged and
        tried again at the next round)."""
        await self._listening.wait()
        while True:
            await asyncio.sleep(self._config.interval_s)
            try:
                await self.refresh()
            except OSError as e:
                logger.warning("cannot write Prometheus targets to %s: %s", self._config.path, e)
