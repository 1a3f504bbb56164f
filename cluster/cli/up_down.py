"""`radixmesh up / down`: run a deployment (`route` and `stats`, which look at one, are in route_stats.py).

    radixmesh up --local 3                 # this machine, 3 simulated nodes; prints the URL, stays up
    radixmesh up --local 2 --prefill 1 --decode 1   # the same, split: a prefill agent and a decode agent
    radixmesh up --address auto            # an existing Ray cluster (`ray up`): one agent per GPU
    radixmesh down
"""

import asyncio
import os
import signal
import socket
import threading
import time
from pathlib import Path

import click
import ray

from radixmesh.cluster.cli.options import (
    ByteSize,
    cache_options,
    check_tls_choice,
    chosen_engine,
    chosen_gpu_blocks,
    chosen_log_level,
    engine_options,
)
from radixmesh.cluster.cli.route_stats import API_KEY_ENV
from radixmesh.cluster.launch import cluster_record, launcher, worker_logging
from radixmesh.cluster.launch.cluster_record import ca_file_path
from radixmesh.cluster.launch.config import NAMESPACE, LauncherConfig
from radixmesh.cluster.launch.ray_auth import AUTH_MODE_ENV, check_token, token_refusal
from radixmesh.cluster.launch.secret_file import SECRET_ENV, default_secret_path, deployment_secret
from radixmesh.cluster.metadata.server import TlsFiles
from radixmesh.cluster.policy.base import policy_names
from radixmesh.cluster.router.admission import AdmissionLimits
from radixmesh.cluster.router.config import DEFAULT_LOCAL_PREFILL_MAX_TOKENS, DEFAULT_POLICY
from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.node_agent import NAMED_CONFIGS, SMOLLM2
from radixmesh.proto.kv_layout import KV_DTYPES


def _prometheus_dir() -> Path:
    return default_secret_path().parent / "prometheus"


def _connect(address: str, config: LauncherConfig | None = None) -> None:
    """Join the Ray cluster at `address`; with `config`, as the job whose actors log at its level."""
    runtime_env = launcher.job_runtime_env(config) if config is not None else None
    try:
        check_token(address)
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False,
                 runtime_env=runtime_env)
    except (ConnectionError, ray.exceptions.AuthenticationError) as e:
        refusal = token_refusal(e, os.environ.get(AUTH_MODE_ENV))
        if refusal is not None:  # a cluster is there, it refused us: "no Ray cluster" would mislead
            raise click.ClickException(f"the Ray cluster at {address!r} {refusal}") from None
        # no Ray cluster at `address`: one line, not a traceback
        raise click.ClickException(f"no Ray cluster at {address!r} ({e}); start one (`ray up`, `ray start "
                                   "--head`) or run `radixmesh up --local N`") from None


@click.command("up")
@click.option("--local", "local_nodes", type=click.IntRange(1, 64), default=None,
              help="Run here in the foreground with N simulated nodes (Ctrl-C or `radixmesh down` stops it).")
@click.option("--prefill", "prefill_nodes", type=click.IntRange(1, 63), default=None,
              help="With --local and --decode: this many of the N agents are prefill agents (the router "
                   "prefills prompts there and hands their KV to a decode agent); N must be prefill + decode.")
@click.option("--decode", "decode_nodes", type=click.IntRange(1, 63), default=None,
              help="With --local and --prefill: this many of the N agents are decode agents.")
@click.option("--local-prefill-max-tokens", default=DEFAULT_LOCAL_PREFILL_MAX_TOKENS, show_default=True,
              type=click.IntRange(min=0),
              help="In a split: a request whose prompt a decode agent already holds, all but at most this many "
                   "tokens (a conversation's next turn), is served there whole instead of handed off; 0: hand "
                   "every request off.")
@click.option("--address", default="auto", show_default=True, help="Ray cluster to join (without --local).")
@click.option("--state", default="memory", show_default=True, help="'memory' or a redis:// URL.")
@click.option("--metadata-standby/--no-metadata-standby", default=False, show_default=True,
              help="With --state redis://: a standby metadata service takes over within ~1 s if the active dies.")
@click.option("--policy", type=click.Choice(policy_names()), default=DEFAULT_POLICY, show_default=True)
@click.option("--host", default=None,
              help="Address router and metadata bind [default: 127.0.0.1 with --local, else this Ray node's address].")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="Router HTTP port.")
@click.option("--model", "model_spec", default="random-tiny", show_default=True,
              help=f"{SMOLLM2} (a real model), a local Hugging Face directory, a .gguf file, or "
                   f"{', '.join('random-' + shape for shape in sorted(NAMED_CONFIGS))} (seeded random weights of "
                   "that shape: for tests and sizing, their text is noise).")
@click.option("--served-model-name", default="", help="Model id clients name (default: the model's name).")
@click.option("--dtype", type=click.Choice(["auto", *KV_DTYPES]), default="auto", show_default=True,
              help="auto: bfloat16 on a GPU, float32 on the CPU.")
@click.option("--gpu-blocks", default=None, type=click.IntRange(min=1),
              help="KV blocks of each agent's gpu tier (CPU agents, or without --gpu-memory-utilization) "
                   "[default: 1024; with --engine modeled, the profile's device].")
@click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Agents on GPUs size their KV pool from this share of the device, less weights and a "
                   "measured activation peak (as vLLM does); e.g. 0.9, or 0.4 for two agents per GPU.")
@click.option("--host-blocks", default=0, show_default=True, type=click.IntRange(min=0),
              help="KV blocks of each agent's host (CPU memory) tier, below the gpu tier: gpu evictions are "
                   "demoted there and host hits promoted back; 0: no host tier.")
@click.option("--host-cache", type=ByteSize(), default=None,
              help="Size of each agent's host tier, e.g. 4GiB or 512MiB (instead of --host-blocks): each agent "
                   "converts it to blocks with its model's KV bytes per block.")
@click.option("--disk-cache", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory of the agents' disk tier, under the host tier (64 staging blocks without "
                   "--host-blocks): each agent writes the blocks its host tier evicts, and on a clean stop every "
                   "cached block, to DIR/<node id> (its own, mode 0700), and finds them again after a restart.")
@click.option("--disk-cache-gb", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Bound on each agent's disk tier, GiB.")
@click.option("--lease-ttl", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Cluster secret (hex, mode 0600) [default: ${SECRET_ENV}, else $RADIXMESH_HOME/secret, "
                   "made on first use].")
@click.option("--api-key", envvar=API_KEY_ENV, default="",
              help=f"Bearer key the OpenAI API requires [default: ${API_KEY_ENV}; none].")
@click.option("--transfer-mac", is_flag=True, help="Agents verify a keyed MAC of every pulled KV chunk.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="PEM certificate (valid for --host) the metadata service and the HTTP API serve TLS with.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Its PEM private key.")
@click.option("--tls-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="An operator's CA (ca.pem, ca.key mode 0600) to mint the servers' certificate from, instead of "
                   "the CA derived from the cluster secret.")
@click.option("--no-tls", is_flag=True,
              help="Serve plain text even beyond loopback (TLS is on by default there): bearer tokens and "
                   "prompts then cross the network readable.")
@click.option("--max-running-per-node", default=AdmissionLimits().max_running_per_node, show_default=True,
              type=click.IntRange(min=1), help="Requests the router runs at once per node; past them they wait.")
@click.option("--max-waiting", default=AdmissionLimits().max_waiting, show_default=True, type=click.IntRange(min=0),
              help="Requests waiting for a slot at most; past them the router answers 429 with Retry-After.")
@click.option("--access-log/--no-access-log", default=True, show_default=True,
              help="One log line per router HTTP request (method, path, status, time, id, node, cached tokens).")
@click.option("--prometheus-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the router keeps its Prometheus file-SD targets and the agents' metrics token "
                   "(default: $RADIXMESH_HOME/prometheus); every agent then serves its own /metrics.")
@click.option("--no-prometheus", is_flag=True, help="No target list and no per-agent /metrics.")
@click.option("--kv-events-endpoint", default=None,
              help="Agents also publish their KV cache events as vLLM does (ZMQ PUB; replay on port + 1, or "
                   "path.replay) at this tcp://host:port or ipc://path, {node} replaced by the node id, e.g. "
                   "ipc:///run/user/UID/radixmesh/kv-{node}. Loopback or ipc only, unless --kv-events-allow-remote.")
@click.option("--kv-events-allow-remote", is_flag=True,
              help="Let --kv-events-endpoint bind beyond loopback: vLLM's event sockets have no authentication.")
@click.option("--kv-events-token-ids", is_flag=True,
              help="Put token ids and cache salts (the prompts) in the KV events: indexers that rebuild hashes "
                   "from tokens need them; without, subscribers see which blocks are held, not which prompts.")
@cache_options
@engine_options
def up(local_nodes: int | None, prefill_nodes: int | None, decode_nodes: int | None, local_prefill_max_tokens: int,
       address: str, state: str, metadata_standby: bool, policy: str, host: str | None,
       port: int, model_spec: str, served_model_name: str, dtype: str, gpu_blocks: int, gpu_memory_utilization: float | None,
       host_blocks: int, host_cache: int | None, disk_cache: Path | None, disk_cache_gb: float,
       lease_ttl: float, secret_file: Path | None, api_key: str, transfer_mac: bool, tls_cert: Path | None,
       tls_key: Path | None, tls_dir: Path | None, no_tls: bool, max_running_per_node: int, max_waiting: int, access_log: bool,
       prometheus_dir: Path | None, no_prometheus: bool, kv_events_endpoint: str | None, kv_events_allow_remote: bool,
       kv_events_token_ids: bool,
       eviction: str, handoff: bool, engine: str, speedup: float) -> None:
    """Start metadata service, node agents and router; print the router URL."""
    check_roles(local_nodes, prefill_nodes, decode_nodes)
    _refuse_a_live_record()
    try:
        check_tls_choice(tls_cert, tls_key, tls_dir, no_tls)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    tls = TlsFiles(tls_cert.read_bytes(), tls_key.read_bytes()) if tls_cert and tls_key else None
    modeled, model = chosen_engine(engine, speedup, model_spec)
    try:
        # Without --host: loopback on one machine, else (host "") the address of this Ray node.
        host = host if host is not None else "127.0.0.1" if local_nodes is not None else ""
        config = LauncherConfig(local_nodes=local_nodes, prefill_nodes=prefill_nodes or 0,
                                decode_nodes=decode_nodes or 0, local_prefill_max_tokens=local_prefill_max_tokens,
                                state=state, metadata_standby=metadata_standby,
                                policy=policy, host=host, http_port=port,
                                model=model, modeled=modeled, model_name=served_model_name, dtype=dtype,
                                gpu_blocks=chosen_gpu_blocks(gpu_blocks, modeled, 16),
                                gpu_memory_utilization=gpu_memory_utilization,
                                host_blocks=host_blocks, host_cache_bytes=host_cache or 0,
                                disk_cache=disk_cache, disk_cache_gb=disk_cache_gb,
                                eviction=eviction, handoff=handoff,
                                lease_ttl_s=lease_ttl, secret=deployment_secret(secret_file),
                                secret_file=secret_file.absolute() if secret_file else None,  # read on every node
                                api_key=api_key,
                                transfer_mac=transfer_mac, tls=tls, tls_default=not no_tls, tls_dir=tls_dir,
                                admission=AdmissionLimits(max_running_per_node=max_running_per_node,
                                                          max_waiting=max_waiting),
                                log_level=chosen_log_level(),
                                log_access=access_log,
                                prometheus_dir=None if no_prometheus else prometheus_dir or _prometheus_dir(),
                                kv_events_endpoint=kv_events_endpoint, kv_events_allow_remote=kv_events_allow_remote,
                                kv_events_token_ids=kv_events_token_ids)
        if tls_dir is not None:
            ClusterCa.load(tls_dir)  # refused now, not after Ray's start; `up` loads it again to mint
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    check_port_free(config.host, port)  # before Ray's 20-50 s start, not after it
    if local_nodes is None:
        _progress(f"joining the Ray cluster at {address}")
        _connect(address, config)
    else:
        _progress(f"starting a local Ray for {local_nodes} simulated node(s)")
        try:
            # The foreground `up` prints its actors' lines (access log, stats) as `vllm serve` does.
            launcher.init_local_ray(config, log_to_driver=True)
        except ValueError as e:  # Ray's token file cannot be used
            raise click.ClickException(str(e)) from None
    try:
        deployment = asyncio.run(launcher.up(config, progress=_progress))
    except (ValueError, launcher.DeploymentExists) as e:
        raise click.ClickException(str(e)) from None
    except ray.exceptions.RayError as e:  # a part failed to start (e.g. --state names a dead Redis)
        raise click.ClickException(f"radixmesh up failed: {_cause(e)}") from None
    pid = os.getpid() if local_nodes is not None else None
    cluster_record.save(cluster_record.ClusterRecord(deployment.router_url, deployment.metadata_address,
                                                     None if pid else address, pid,
                                                     cluster_record.running_since(pid) if pid else None))
    click.echo(f"radixmesh is up: {len(deployment.nodes)} agent(s) ({config.engine_label} engine), "
               f"metadata service {deployment.metadata_address}")
    click.echo(f"router: {deployment.router_url}   (OpenAI API at {deployment.router_url}/v1)", nl=True)
    if deployment.router_url.startswith("https:"):
        _progress(f"TLS: clients verify the router and the metadata service against {ca_file_path()} "
                  "(`radixmesh stats` and `route` do; `radixmesh ca-cert` prints it on any host with the secret)")
    logs = worker_logging.logs_dir()
    where = f" in {logs} (worker-*.err)" if logs is not None else ""
    shown = "printed here too" if local_nodes is not None else "not printed here"
    _progress(f"logs: the access log and the stats line of every actor are written{where}, {shown}")
    if local_nodes is not None:
        _serve_until_signalled()


def check_roles(local_nodes: int | None, prefill_nodes: int | None, decode_nodes: int | None) -> None:
    """click.UsageError for a split `up` cannot start: --prefill without --decode (or the reverse), a
    split without --local, or --local N that is not prefill + decode (N counts every agent)."""
    if prefill_nodes is None and decode_nodes is None:
        return
    if prefill_nodes is None or decode_nodes is None:
        raise click.UsageError("--prefill and --decode go together: a split needs both kinds of agent")
    if local_nodes is None:
        raise click.UsageError(f"--prefill/--decode need --local {prefill_nodes + decode_nodes}; on a Ray cluster, "
                               "start the nodes with the radixmesh_prefill or radixmesh_decode resource instead")
    if local_nodes != prefill_nodes + decode_nodes:
        raise click.UsageError(f"--prefill {prefill_nodes} --decode {decode_nodes} make {prefill_nodes + decode_nodes} "
                               f"agents, but --local says {local_nodes}: --local N counts every agent")


def _progress(line: str) -> None:
    """One phase of `up`, on stderr: stdout keeps the lines scripts read (the router URL)."""
    click.echo(f"[{time.strftime('%H:%M:%S')}] {line}", err=True)


def check_port_free(host: str, port: int) -> None:
    """click.ClickException when `port` (not 0) is taken on `host` ("": any address of this machine,
    where the router runs): found now, not when the router binds it after Ray and the agents started."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds: TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as e:
            raise click.ClickException(f"port {port} on {host or 'this machine'} is not free ({e.strerror}): "
                                       "stop what uses it, or pick another with --port (0: any free port)") from None


def _cause(e: ray.exceptions.RayError) -> str:
    """The first line of what failed inside an actor, without Ray's traceback."""
    cause = e.cause if isinstance(e, ray.exceptions.RayTaskError) and e.cause is not None else e
    return (str(cause).strip().splitlines() or [type(cause).__name__])[-1]


def _serve_until_signalled() -> None:
    """Hold the local deployment (its Ray lives in this process) until SIGINT/SIGTERM, then stop it."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    click.echo("serving; Ctrl-C or `radixmesh down` stops it", err=True)
    stop.wait()
    asyncio.run(launcher.down())
    ray.shutdown()
    cluster_record.remove()
    click.echo("radixmesh is down")


@click.command("down")
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(min=0))
def down(timeout: float) -> None:
    """Stop the recorded deployment: router and agents, metadata service (and a local `up`'s Ray).
    Idempotent, as `ray stop` is: with nothing running it says so and exits 0."""
    record = _record()
    if record is None:
        click.echo(f"nothing is running (no deployment recorded at {cluster_record.record_path()})")
        return
    if record.pid is not None:
        # Identity is (pid, start time), never the command line: any process may call itself
        # `radixmesh up`, none can start at the recorded time under the recorded pid but that `up`.
        if not _alive(record):
            cluster_record.remove()
            click.echo(f"nothing is running: the `up` process {record.pid} that made the record has ended "
                       "(nothing signalled); the record is cleared")
            return
        try:
            os.kill(record.pid, signal.SIGTERM)
        except ProcessLookupError:
            cluster_record.remove()
            click.echo(f"nothing is running: the `up` process {record.pid} is gone; the record is cleared")
            return
        deadline = time.monotonic() + timeout
        while cluster_record.running_since(record.pid) == record.pid_start:
            if time.monotonic() > deadline:
                raise click.ClickException(f"`up` process {record.pid} did not stop within {timeout:.0f} s")
            time.sleep(0.2)  # polling another process's exit: there is nothing to wait on
        click.echo("radixmesh is down")
        return
    assert record.ray_address is not None
    try:
        _connect(record.ray_address)
    except click.ClickException as e:  # the Ray cluster is gone, and the deployment with it
        cluster_record.remove()
        click.echo(f"nothing is running: {e.message}; the record is cleared")
        return
    stopped = asyncio.run(launcher.down())
    cluster_record.remove()
    click.echo("radixmesh is down" if stopped else "nothing was running; the record is cleared")


def _record() -> cluster_record.ClusterRecord | None:
    try:
        return cluster_record.load()
    except ValueError as e:
        raise click.ClickException(str(e)) from None


def _alive(record: cluster_record.ClusterRecord) -> bool:
    """Whether the foreground `up` that wrote `record` still runs (same pid, same start time)."""
    assert record.pid is not None
    return record.pid_start is not None and cluster_record.running_since(record.pid) == record.pid_start


def _refuse_a_live_record() -> None:
    """`up` refuses while the recorded deployment runs; the record of an `up --local` that died
    (killed, crashed) is cleared on the way, as vLLM leaves nothing to clean up after a crash."""
    record = _record()
    if record is None:
        return
    if record.pid is not None and not _alive(record):
        cluster_record.remove()
        click.echo(f"note: cleared the record of an `up` (process {record.pid}) that has ended", err=True)
        return
    raise click.ClickException(f"a deployment is running (recorded at {cluster_record.record_path()}, router "
                               f"{record.router_url}): `radixmesh down` first")
