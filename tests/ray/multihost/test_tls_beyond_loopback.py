"""A server bound beyond loopback serves TLS by default (issue 38, item 16): `radixmesh metadata-server`
in a network namespace on 198.18.0.1 with the cluster secret, reached over the bridge from here."""

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret
from tests.ray.multihost.conftest import FAMILY, multihost_lock
from tests.support.netns_hosts import HostNetwork, sweep_leftovers

pytestmark = [pytest.mark.ray, pytest.mark.integration]  # under tests/ray: scheduled beside no other multihost test
SECRET = ClusterSecret(bytes(range(32)))


def test_the_metadata_service_beyond_loopback_is_tls_by_default_and_refuses_plain_text(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and `ip netns`")
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET.to_hex())
    secret_file.chmod(0o600)
    with multihost_lock():
        sweep_leftovers(FAMILY)
        with HostNetwork(f"{FAMILY}t{os.getpid() % 1000}") as network:
            host = network.add_host()
            proc = network.popen(host, [sys.executable, "-m", "radixmesh.cluster.cli", "metadata-server", "--host",
                                        host.address, "--port", "0", "--secret-file", str(secret_file)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()
            assert line.startswith(f"metadata-server listening on {host.address}:") and "TLS" in line, line
            target = line.split()[3]
            asyncio.run(_only_the_cas_clients_get_through(target))


async def _only_the_cas_clients_get_through(target: str) -> None:
    cluster = CallerCredentials.cluster(SECRET)
    async with MetadataClient(target, credentials=cluster, root_certificates=ClusterCa.derive(SECRET).certificate,
                              timeout_s=10) as trusting:
        assert (await trusting.stats()).live_nodes == 0
    async with MetadataClient(target, credentials=cluster, timeout_s=3) as plain:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await plain.stats()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
