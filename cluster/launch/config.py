"""Settings of one radixmesh deployment: how many agents, which model, where state lives, how to route.

One frozen dataclass the CLI, the demo and the tests build; the launcher derives each agent's
AgentConfig and the router's RouterConfig from it, so every agent of a deployment shares one layout.
"""

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from radixmesh.cluster.launch import LOG_LEVELS
from radixmesh.cluster.metadata.server import TlsFiles
from radixmesh.cluster.policy.base import PolicyConfig, policy_names
from radixmesh.cluster.router.admission import AdmissionLimits
from radixmesh.cluster.router.config import DEFAULT_LOCAL_PREFILL_MAX_TOKENS, DEFAULT_POLICY, RouterConfig
from radixmesh.common.block_pool.config import PoolConfig
from radixmesh.common.block_pool.eviction import DEFAULT_EVICTION, DEFAULT_HANDOFF, EVICTION_ORDERS
from radixmesh.common.secret import ClusterSecret, check_api_bind
from radixmesh.node_agent import (
    TRANSFER_PLANES,
    AgentConfig,
    EngineConfig,
    MemoryConfig,
    ModeledEngine,
    ModelSource,
    random_source,
)
from radixmesh.proto.ids import NodeId

NAMESPACE = "radixmesh"
"""Ray namespace of every actor a deployment creates (named, so `down` and `route` find them)."""


@dataclass(frozen=True, slots=True)
class LauncherConfig:
    """One deployment. Defaults fit a laptop: the `tiny` random model, memory state, UCX on loopback."""

    local_nodes: int | None = None
    """N simulated nodes on this machine (agents pinned by custom resources); None: one agent per GPU
    of the Ray cluster."""
    prefill_nodes: int = 0
    """Of the `local_nodes`, how many are prefill agents (node-0 ...), the rest decode agents
    (docs/disaggregation.md); 0 with `decode_nodes` 0: every agent does both (aggregated)."""
    decode_nodes: int = 0
    """Of the `local_nodes`, how many are decode agents (the last ones)."""
    stream_handoff: bool = True
    """A split deployment's hand-off follows the prefill chunk by chunk (RouterConfig.stream_handoff);
    False: it begins once the prefill has ended."""
    local_prefill_max_tokens: int = DEFAULT_LOCAL_PREFILL_MAX_TOKENS
    """A split deployment serves a request whole on the decode agent holding all its prompt but at
    most this many tokens (RouterConfig.local_prefill_max_tokens); 0: every request is handed off."""
    host: str = "127.0.0.1"
    """Address the router's HTTP server and the metadata service bind (and advertise); "": the address
    of the Ray node `up` runs on (a multi-host cluster: reachable by every node, unlike 127.0.0.1).
    Never 0.0.0.0 unless given."""
    http_port: int = 0
    """Router HTTP port; 0: a free one (the URL is printed)."""
    metadata_port: int = 0
    """Metadata gRPC port; 0: a free one."""
    state: str = "memory"
    """Metadata state store: "memory" or a redis:// URL."""
    metadata_standby: bool = False
    """A second metadata service on the same Redis state takes over within ~1 s when the active dies
    (a leader key in Redis); agents and the router are given both addresses. Needs a redis:// state.
    Off by default: stopping the metadata service then means an outage (what `radixmesh down`,
    the fault tests and bench/chaos.py expect), and it costs a second actor polling Redis."""
    lease_ttl_s: float = 10.0
    """A node vanishes from the index this long after its last heartbeat."""
    policy: str = DEFAULT_POLICY
    """Routing policy (policy.base.policy_names())."""
    model: ModelSource = field(default_factory=random_source)
    """Every agent's model (model.source.resolve_model); its files must be readable on every node."""
    dtype: str = "auto"
    """Weights and KV precision of every agent (AgentConfig.dtype)."""
    modeled: ModeledEngine | None = None
    """Every agent's forward priced by a profile's time model (AgentConfig.modeled, `--engine modeled:P`);
    None: the real model."""
    block_size: int = 16
    gpu_blocks: int = 1024
    """KV blocks of each agent's gpu tier (unless gpu_memory_utilization sizes it)."""
    gpu_memory_utilization: float | None = None
    """Agents on GPUs size their gpu tier from this share of the device (AgentConfig)."""
    host_blocks: int = 0
    """KV blocks of each agent's host tier (MemoryConfig.num_host_blocks; `up --host-blocks`); 0: none."""
    host_cache_bytes: int = 0
    """Bytes of each agent's host tier instead (`up --host-cache 4GiB`; AgentConfig.host_cache_bytes):
    each agent converts them with its model's KV bytes per block. 0: host_blocks decides."""
    disk_cache: Path | None = None
    """Each agent keeps a disk tier under its host tier in <disk_cache>/<node id> (AgentConfig.disk_cache),
    which a deployment started again with the same directory finds again. Without host_blocks, the
    agents stage disk reads in a small host tier (MemoryConfig.host_blocks)."""
    disk_cache_gb: float = 10.0
    """Bound on each agent's disk tier, GiB."""
    prefix_caching: bool = True
    """False: agents neither reuse nor publish prefixes (the demo's "caching off" baseline)."""
    eviction: str = DEFAULT_EVICTION
    """Which cached block every agent evicts first (PoolConfig.eviction; EVICTION_ORDERS names them)."""
    handoff: bool = DEFAULT_HANDOFF
    """Agents evict first the blocks a peer pulled from them (AgentConfig.handoff)."""
    transfer: str = "ucx"
    """KV transfer plane of the agents: one of agent_config.TRANSFER_PLANES ("ucx", "ray", "auto", "none")."""
    secret: ClusterSecret = field(default_factory=ClusterSecret.generate)
    """The deployment's cluster secret (`up` reads or makes it, see launch.secret_file): the metadata
    service, every node's credential and the block-hash key derive from it. Actors never get it:
    each loads it on its own node (launch.secret_file.NodeSecret)."""
    secret_file: Path | None = None
    """Where every node holds `secret` (`up --secret-file`); None: RADIXMESH_SECRET in the environment
    of Ray's workers, else $RADIXMESH_HOME/secret."""
    api_key: str = ""
    """Bearer key the OpenAI API requires ("": none)."""
    transfer_mac: bool = False
    """Agents verify a keyed MAC of every pulled chunk."""
    tls: TlsFiles | None = None
    """Certificate (PEM, valid for `host`) and key that the metadata service and the router's HTTP API
    serve TLS with; agents and the router then verify the metadata service against `tls.trust`.
    None: `up` mints one when `tls_default` says so (launch.tls.with_tls)."""
    tls_default: bool = True
    """With no `tls` and a `host` beyond loopback, `up` serves the metadata service and the API over
    TLS with a certificate it mints from the cluster CA (`tls_dir`'s, else the secret's), and agents
    beyond loopback serve their own /metrics over TLS (AgentConfig.metrics_tls). False: plain text
    (`up --no-tls`): bearer tokens and prompts cross the network readable."""
    tls_dir: Path | None = None
    """An operator's CA (`ca.pem`, `ca.key` mode 0600: common.cluster_ca.ClusterCa.load) to mint the
    certificate from, instead of the CA derived from the secret (`up --tls-dir`)."""
    heartbeat_interval_s: float = 1.0
    publish_interval_s: float = 0.05
    metadata_retry_s: float = 1.0
    """How long the router routes without prefixes after a failed Match before asking again."""
    model_name: str = ""
    """The model id clients name in requests (--served-model-name); "": the model's own name."""
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    """Requests the router runs and queues at once; past them it answers 429."""
    log_level: str = "INFO"
    """Logging level of every actor (the runtime_env of the deployment's Ray job: launch/worker_logging.py)."""
    log_access: bool = True
    """The router writes one access-log line per HTTP request (logger radixmesh.access)."""
    prometheus_dir: Path | None = None
    """Where the router keeps its Prometheus file-SD target list and the agents' metrics token
    (observability.file_sd); every agent then serves its own /metrics. None: neither."""
    kv_events_endpoint: str | None = None
    """Every agent also publishes its cache events in vLLM's ZMQ format (AgentConfig.kv_events_endpoint)
    here, "{node}" replaced by its node id: ipc:///run/user/UID/radixmesh/kv-{node} keeps the agents of one
    host apart, a tcp://127.0.0.1:port suits one agent per host. None: not published."""
    kv_events_allow_remote: bool = False
    """Let kv_events_endpoint be a non-loopback address (AgentConfig.kv_events_allow_remote)."""
    kv_events_token_ids: bool = False
    """The KV events carry token ids and cache salts (AgentConfig.kv_events_token_ids)."""

    def __post_init__(self) -> None:
        if self.local_nodes is not None and not 1 <= self.local_nodes <= 64:
            raise ValueError(f"local_nodes must be in [1, 64], got {self.local_nodes}")
        self._check_roles()
        for name in ("http_port", "metadata_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ValueError(f"{name} must be in [0, 65535], got {getattr(self, name)}")
        if self.state != "memory" and not self.state.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"state must be 'memory' or a redis:// URL, got {self.state!r}")
        if self.metadata_standby and self.state == "memory":
            raise ValueError("metadata_standby needs a redis:// state: the standby restores from it")
        if self.policy not in policy_names():
            raise ValueError(f"unknown policy {self.policy!r}; valid: {', '.join(policy_names())}")
        if self.eviction not in EVICTION_ORDERS:
            raise ValueError(f"eviction must be one of {', '.join(sorted(EVICTION_ORDERS))}, got {self.eviction!r}")
        if self.transfer not in TRANSFER_PLANES:
            raise ValueError(f"transfer must be one of {TRANSFER_PLANES}, got {self.transfer!r}")
        for name in ("lease_ttl_s", "heartbeat_interval_s", "publish_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if self.heartbeat_interval_s >= self.lease_ttl_s:
            raise ValueError(f"heartbeat_interval_s ({self.heartbeat_interval_s}) must be shorter than "
                             f"lease_ttl_s ({self.lease_ttl_s}), or every lease would lapse")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if self.block_size < 1 or self.gpu_blocks < 1 or self.host_blocks < 0:
            raise ValueError("need block_size >= 1, gpu_blocks >= 1 and host_blocks >= 0")
        if self.host_cache_bytes:  # refused here (AgentConfig checks it), not when the first agent starts
            self.agent_config(NodeId("node-0"), "", "")
        if self.disk_cache is not None:  # refused here, not when the first agent starts
            if not (math.isfinite(self.disk_cache_gb) and self.disk_cache_gb > 0):
                raise ValueError(f"disk_cache_gb must be a finite number > 0, got {self.disk_cache_gb}")
            self.agent_config(NodeId("node-0"), "", "")
        # host "": the Ray node's address, never loopback. Refused here, not after Ray has started.
        check_api_bind(self.host, self.api_key)
        if self.tls_dir is not None and not self.tls_default:
            raise ValueError("tls_dir mints certificates for TLS, which tls_default=False (--no-tls) turns off")
        if self.kv_events_endpoint is not None:  # refused here, not when the first agent starts
            node = NodeId("node-0")
            AgentConfig(node, kv_events_endpoint=self.kv_events_endpoint_of(node),
                        kv_events_allow_remote=self.kv_events_allow_remote)

    @property
    def served_model_name(self) -> str:
        return self.model_name or self.model.name

    @property
    def engine_label(self) -> str:
        """What this deployment's figures are labelled: "real" or "modeled:<profile>"."""
        return "real" if self.modeled is None else self.modeled.label

    def kv_events_endpoint_of(self, node: NodeId) -> str | None:
        """Where `node`'s agent publishes vLLM-format KV events (kv_events_endpoint)."""
        return None if self.kv_events_endpoint is None else self.kv_events_endpoint.replace("{node}", node)

    def _check_roles(self) -> None:
        p, d = self.prefill_nodes, self.decode_nodes
        if not p and not d:
            return
        if p < 1 or d < 1:
            raise ValueError(f"a prefill/decode split needs at least one prefill and one decode agent, got "
                             f"{p} prefill and {d} decode")
        if self.local_nodes is None:
            raise ValueError("prefill_nodes and decode_nodes count simulated nodes (--local); on a Ray cluster a "
                             "node's resources give its agents their role (radixmesh_prefill, radixmesh_decode)")
        if p + d != self.local_nodes:
            raise ValueError(f"{p} prefill + {d} decode agents make {p + d}, but local_nodes is "
                             f"{self.local_nodes}: the local nodes count every agent")

    def role_of(self, node: NodeId) -> str:
        """`node`'s role (NODE_ROLES): node-0 .. node-(P-1) prefill, the next D decode; else both."""
        if not self.prefill_nodes:
            return "both"
        ids = self.node_ids(self.prefill_nodes + self.decode_nodes)
        return "prefill" if node in ids[: self.prefill_nodes] else "decode" if node in ids else "both"

    def node_ids(self, count: int) -> list[NodeId]:
        """Names of `count` nodes: node-0, node-1, ..."""
        return [NodeId(f"node-{i}") for i in range(count)]

    def agent_config(self, node: NodeId, metadata_address: str, host: str) -> AgentConfig:
        """The AgentConfig of `node`, whose transfer server binds `host`."""
        memory = MemoryConfig(num_gpu_blocks=self.gpu_blocks, num_host_blocks=self.host_blocks,
                              enable_prefix_caching=self.prefix_caching, hash_key=self.secret.hash_key(),
                              pool=PoolConfig(eviction=self.eviction))
        return AgentConfig(node, model=self.model, role=self.role_of(node), served_model_name=self.served_model_name,
                           dtype=self.dtype,
                           gpu_memory_utilization=self.gpu_memory_utilization, modeled=self.modeled,
                           engine=EngineConfig(block_size=self.block_size, memory=memory), host=host,
                           transfer=self.transfer, secret=self.secret, transfer_mac=self.transfer_mac,
                           handoff=self.handoff,
                           metadata_root_certificates=self.tls.trust if self.tls else None,
                           # Without caching there is nothing to publish: agents stay standalone.
                           metadata_address=metadata_address if self.prefix_caching else None,
                           heartbeat_interval_s=self.heartbeat_interval_s,
                           publish_interval_s=self.publish_interval_s,
                           metrics_port=0 if self.prometheus_dir is not None else None,
                           metrics_tls=self.tls_default,
                           kv_events_endpoint=self.kv_events_endpoint_of(node),
                           disk_cache=str(self.disk_cache / node) if self.disk_cache is not None else None,
                           disk_cache_bytes=int(self.disk_cache_gb * 2**30),
                           host_cache_bytes=self.host_cache_bytes,
                           kv_events_allow_remote=self.kv_events_allow_remote,
                           kv_events_token_ids=self.kv_events_token_ids)

    def router_config(self, layout: str, block_bytes: int) -> RouterConfig:
        """The router's settings for agents of `layout` whose blocks hold `block_bytes` of KV. A modeled
        deployment's pulls cross the profile's link (sped up like every wait), so a pair not measured
        yet is priced at that rate: at the default (this box's 2.5 GB/s) the pulls of a modeled H100
        cluster slowed 50x (0.8 GB/s) took 2.7-3.3x their price at p50, most of them on a pair's first
        pulls."""
        # The agents' engines run EngineConfig's sequence cap (agent_config sets only the block size
        # and memory): the router prices the wait for a slot against it.
        policy = PolicyConfig(block_bytes=block_bytes, max_seqs=EngineConfig(block_size=self.block_size).max_num_seqs)
        if self.modeled is not None:
            policy = replace(policy, pull_bytes_per_s=self.modeled.wire_gbps * 1e9)
        return RouterConfig(layout, block_size=self.block_size, policy=self.policy,
                            policy_config=policy, model_name=self.served_model_name,
                            hash_key=self.secret.hash_key(),
                            limits=self.model.config.prompt_limits(), admission=self.admission,
                            metadata_retry_s=self.metadata_retry_s, stream_handoff=self.stream_handoff,
                            local_prefill_max_tokens=self.local_prefill_max_tokens)
