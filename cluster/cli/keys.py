"""`radixmesh admin-key` / `ca-cert` / `kv-events-keys` / `ray-tls`: print the router's admin key, the
cluster CA's certificate, the CURVE keys of the agents' KV-events sockets, or the environment of Ray's
TLS with this host's certificate, all derived from the cluster secret.

The admin key opens the prefix-cache reset and /stats' per-tenant table (cluster/api/admin.py). It
is never stored: whoever holds the secret derives it again, so it is printed where the secret is
(the head, as the user `up` ran as). No secret is made here: none is an error, not a new one (`ray-tls`
writes only this host's certificate, from the secret there).
"""

import shlex
from pathlib import Path

import click

from radixmesh.cluster.api.admin import admin_key
from radixmesh.cluster.launch.ray_tls import host_addresses, ray_tls_files
from radixmesh.cluster.launch.secret_file import SECRET_ENV, node_secret
from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.common.kv_events_curve import key_pair
from radixmesh.common.secret import ClusterSecret, KeyPurpose


@click.command("admin-key")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Cluster secret (hex, mode 0600) [default: ${SECRET_ENV}, else $RADIXMESH_HOME/secret].")
def admin_key_command(secret_file: Path | None) -> None:
    """Print the router's admin key, derived from the cluster secret.

    Send it as `Authorization: Bearer <key>` to /reset_prefix_cache, /flush_cache and /stats."""
    click.echo(admin_key(_secret(secret_file)))


@click.command("ca-cert")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Cluster secret (hex, mode 0600) [default: ${SECRET_ENV}, else $RADIXMESH_HOME/secret].")
def ca_cert_command(secret_file: Path | None) -> None:
    """Print the cluster CA's certificate (PEM), derived from the cluster secret.

    Clients of a deployment `up` served over TLS with it trust this file (Prometheus' ca_file, curl's
    --cacert); it is public, the same on every host that holds the secret."""
    click.echo(ClusterCa.derive(_secret(secret_file)).certificate.decode(), nl=False)


@click.command("kv-events-keys")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Cluster secret (hex, mode 0600) [default: ${SECRET_ENV}, else $RADIXMESH_HOME/secret].")
def kv_events_keys_command(secret_file: Path | None) -> None:
    """Print the CURVE keys (z85) a subscriber of the agents' tcp KV-events sockets sets.

    server_public goes in ZMQ_CURVE_SERVERKEY, client_public and client_secret in ZMQ_CURVE_PUBLICKEY
    and ZMQ_CURVE_SECRETKEY of the SUB and replay DEALER sockets; the agents admit no other key."""
    secret = _secret(secret_file)
    server, client = key_pair(secret, KeyPurpose.KV_EVENTS_SERVER), key_pair(secret, KeyPurpose.KV_EVENTS_CLIENT)
    click.echo(f"server_public={server.public.decode()}\nclient_public={client.public.decode()}\n"
               f"client_secret={client.secret.decode()}")


@click.command("ray-tls")
@click.option("--secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help=f"Cluster secret (hex, mode 0600) [default: ${SECRET_ENV}, else $RADIXMESH_HOME/secret].")
@click.option("--address", "addresses", multiple=True,
              help="An address peers dial this host by (repeatable) [default: every address of this host].")
@click.option("--also-address", "also", multiple=True,
              help="A further address or DNS name peers dial this host by, such as a Kubernetes Service's "
                   "(repeatable).")
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write node.pem, node.key and ca.pem into this folder, made 0700 if missing; one others "
                   "can write is refused [default: $RADIXMESH_HOME/ray-tls/<address>].")
def ray_tls_command(secret_file: Path | None, addresses: tuple[str, ...], also: tuple[str, ...],
                    folder: Path | None) -> None:
    """Print `export` lines for Ray's mutual TLS with this host's certificate of the cluster CA.

    The certificate is minted from the secret into --dir, or $RADIXMESH_HOME/ray-tls/<address>/, when
    none naming these addresses is there; run `eval "$(radixmesh ray-tls)"` before `ray start` and every
    Ray command on each host (deploy/*.yaml do; deploy/kuberay runs it with --dir in an initContainer)."""
    secret = _secret(secret_file)
    try:
        files = ray_tls_files(secret, [*(addresses or host_addresses()), *also], folder)
    except (OSError, ValueError) as e:
        raise click.ClickException(f"Ray's TLS files: {e}") from None
    click.echo("\n".join(f"export {name}={shlex.quote(value)}" for name, value in files.environment().items()))


def _secret(secret_file: Path | None) -> ClusterSecret:
    try:
        return node_secret(secret_file)
    except ValueError as e:  # missing, readable by others, or not a secret: one line, exit 1
        raise click.ClickException(f"{e} (`radixmesh up` makes the secret on first use)") from None
