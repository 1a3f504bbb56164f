"""The `radixmesh` console script: a thin click group; each subcommand parses, builds, and hands off.

Errors a user can fix (a bad --state, an unreachable Redis, unreadable TLS files) end as one line on
stderr and a non-zero exit.
"""

import asyncio
import logging
import socket
from pathlib import Path

import click
import redis

from radixmesh.cluster.cli.cluster import down, route, stats, up
from radixmesh.cluster.cli.demo import demo
from radixmesh.cluster.cli.front import front
from radixmesh.cluster.cli.replay import replay_command
from radixmesh.cluster.cli.sim import sim
from radixmesh.cluster.launch.secret_file import SECRET_ENV, given_secret
from radixmesh.cluster.metadata.server import ServerOptions, TlsFiles, create_server, serve_until_signalled
from radixmesh.cluster.metadata.service import MetadataService, ServiceConfig
from radixmesh.cluster.metadata.store import open_store
from radixmesh.proto.cluster_secret import check_bind


@click.group()
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
def main(log_level: str) -> None:
    """radixmesh: a distributed prefix KV-cache cluster for LLM serving."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command("metadata-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=50051, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--state", default="memory", show_default=True, help="'memory' or a redis:// URL.")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Cluster secret (hex, mode 0600); default ${SECRET_ENV}. Required unless --host is loopback.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--lease-ttl", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--grace", default=5.0, show_default=True, type=click.FloatRange(min=0), help="Seconds to drain.")
def metadata_server(
    host: str,
    port: int,
    state: str,
    secret_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    lease_ttl: float,
    grace: float,
) -> None:
    """Run the global metadata service until SIGINT/SIGTERM."""
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    tls = TlsFiles(tls_cert.read_bytes(), tls_key.read_bytes()) if tls_cert and tls_key else None
    try:
        secret = given_secret(secret_file)
        options = ServerOptions(host=host, port=port, secret=secret, tls=tls)
        check_bind("metadata-server", host, secret)
        store = open_store(state)
    except (ValueError, redis.RedisError) as e:
        raise click.ClickException(str(e)) from None
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
            click.echo(f"metadata-server listening on {host}:{bound} (state: {store.describe()})")

        await serve_until_signalled(server, grace, ready)

    asyncio.run(serve())


def _check_port_free(host: str, port: int) -> None:
    """One clean line for a busy port (gRPC's own failure also prints its C-core log to stderr)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        try:
            probe.bind((host, port))
        except OSError as e:
            raise click.ClickException(f"could not bind {host}:{port}: {e.strerror}") from None


main.add_command(sim)
main.add_command(up)
main.add_command(down)
main.add_command(route)
main.add_command(stats)
main.add_command(demo)
main.add_command(replay_command)
main.add_command(front)
