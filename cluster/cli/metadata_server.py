"""`radixmesh metadata-server`: the global metadata service as a process of its own (`up` runs it as a
Ray actor instead)."""

import asyncio
import signal
import socket
from pathlib import Path

import click
import redis

from radixmesh.cluster.launch.secret_file import SECRET_ENV, given_secret
from radixmesh.cluster.metadata.leader_server import serve_as_leader
from radixmesh.cluster.metadata.server import (
    ServerOptions,
    TlsFiles,
    create_server,
    serve_until_signalled,
)
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.metadata.service_config import ServiceConfig
from radixmesh.cluster.metadata.store import open_store
from radixmesh.common.cluster_ca import ClusterCa, served_names
from radixmesh.common.secret import check_bind, is_loopback


@click.command("metadata-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=50051, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--state", default="memory", show_default=True, help="'memory' or a redis:// URL.")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Cluster secret (hex, mode 0600); default ${SECRET_ENV}. Required unless --host is loopback.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--no-tls", is_flag=True,
              help="Serve plain text beyond loopback too (TLS with a certificate of the cluster CA is the default "
                   "there): node tokens then cross the network readable.")
@click.option("--lease-ttl", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--grace", default=5.0, show_default=True, type=click.FloatRange(min=0), help="Seconds to drain.")
@click.option("--leader-lease", is_flag=True,
              help="With --state redis://: serve only while holding the leader key in that Redis, so a second "
                   "one started the same way is a standby that takes over (clients list both addresses).")
def metadata_server(
    host: str,
    port: int,
    state: str,
    secret_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    no_tls: bool,
    lease_ttl: float,
    grace: float,
    leader_lease: bool,
) -> None:
    """Run the global metadata service until SIGINT/SIGTERM."""
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if leader_lease and not state.startswith(("redis://", "rediss://", "unix://")):
        raise click.UsageError("--leader-lease needs --state redis://...")
    tls = TlsFiles(tls_cert.read_bytes(), tls_key.read_bytes()) if tls_cert and tls_key else None
    try:
        secret = given_secret(secret_file)
        if tls is None and not no_tls and secret is not None and not is_loopback(host):
            # A wildcard host is reached by this machine's name; clients trust `radixmesh ca-cert`.
            served = ClusterCa.derive(secret).issue(served_names(host, socket.getfqdn()))
            tls = TlsFiles(served.cert_chain, served.private_key, served.ca)
        options = ServerOptions(host=host, port=port, secret=secret, tls=tls)
        check_bind("metadata-server", host, secret)
        store = open_store(state)
    except (ValueError, redis.RedisError) as e:
        raise click.ClickException(str(e)) from None
    if leader_lease:
        store.close()  # opened to fail fast on a bad URL; the leader opens its own once elected
        asyncio.run(_serve_as_leader(state, options, lease_ttl))
        return
    service = MetadataService(store, ServiceConfig(lease_ttl_s=lease_ttl))

    async def serve() -> None:
        if port:
            _check_port_free(host, port)
        try:
            server, bound = create_server(service, options)
        except RuntimeError as e:  # grpc: "Failed to bind to address ..."
            raise click.ClickException(f"could not bind {host}:{port}: {e}") from None
        if bound == 0:
            raise click.ClickException(f"could not bind {host}:{port}")

        def ready() -> None:
            over = "TLS, clients trust `radixmesh ca-cert`" if tls is not None and tls.ca else "TLS" if tls else "plain text"
            click.echo(f"metadata-server listening on {host}:{bound} ({over}; state: {store.describe()})")

        await serve_until_signalled(server, grace, ready)

    asyncio.run(serve())


async def _serve_as_leader(state: str, options: ServerOptions, lease_ttl: float) -> None:
    """Serve while holding the leader key (leader_server); exit 1 when the key is lost."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        held = await serve_as_leader(state, options, lease_ttl, stop, say=click.echo)
    except (ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    if not held:
        raise click.ClickException("lost the leader key: stopped serving (a standby serves now)")


def _check_port_free(host: str, port: int) -> None:
    """One clean line for a busy port (gRPC's own failure also prints its C-core log to stderr)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        try:
            probe.bind((host, port))
        except OSError as e:
            raise click.ClickException(f"could not bind {host}:{port}: {e.strerror}") from None
