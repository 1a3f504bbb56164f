"""Ray locked (issue 28, finding 3): no actor's arguments carry the cluster secret or a key derived
from it, the router's API key or the TLS private key (Ray keeps them in its GCS, readable by anyone
who reaches Ray); each actor loads them on its own node from 0600 files, and refuses a secret that is
not the deployment's or a key file others can read. The Ray that `up --local` starts answers only
callers with its token, kept in a 0600 file."""

import asyncio
import os
import ssl
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import ray
from ray import cloudpickle

from radixmesh.cluster.fleet.agent_client import StaticAgentDirectory
from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.launch.metadata_actor import MetadataActor, make_metadata_actor
from radixmesh.cluster.launch.ray_auth import AUTH_MODE_ENV, TOKEN_PATH_ENV, ray_token_path
from radixmesh.cluster.launch.router_actor import RouterActor, make_router_actor
from radixmesh.cluster.launch.secret_file import (
    SECRET_ENV,
    NodeKey,
    NodeSecret,
    api_key_path,
    create_secret,
    default_secret_path,
    tls_key_path,
)
from radixmesh.cluster.metadata.server import TlsFiles
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret, KeyPurpose
from radixmesh.node_agent.actor import AgentActor, AgentPlacement, make_agent_actor
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.nodes import NodeInfo

pytestmark = pytest.mark.ray

NODE = NodeId("node-0")
API_KEY = "sk-deployment-api-key-4f1c"


@dataclass
class _FakeRemote:
    """Stands in for `ray.remote(cls).options(...)`: records what `.remote(...)` would ship, as Ray
    serialises it."""

    shipped: list[tuple[type, bytes]] = field(default_factory=list)
    cls: type | None = None

    def __call__(self, cls: type) -> "_FakeRemote":
        self.cls = cls
        return self

    def options(self, **_: Any) -> "_FakeRemote":
        return self

    def remote(self, *args: Any) -> str:
        assert self.cls is not None
        self.shipped.append((self.cls, cloudpickle.dumps(args)))
        return "handle"


@pytest.fixture
def secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ClusterSecret:
    """The deployment's secret in $RADIXMESH_HOME/secret (0600), as `up` makes it."""
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path))
    monkeypatch.delenv(SECRET_ENV, raising=False)
    return create_secret(default_secret_path())


@pytest.fixture
def shipped(monkeypatch: pytest.MonkeyPatch) -> _FakeRemote:
    fake = _FakeRemote()
    monkeypatch.setattr(ray, "remote", fake)
    return fake


def _secret_forms(secret: ClusterSecret) -> list[bytes]:
    """Every form in which the secret or a key derived from it could travel."""
    keys = [secret.value, *(secret.key(p, NODE if p.per_node else None) for p in KeyPurpose)]
    return [form for key in keys for form in (key, key.hex().encode())]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A self-signed certificate for 127.0.0.1 and its key (PEM), as `up --tls-cert --tls-key` reads them."""
    d = tmp_path_factory.mktemp("tls")
    key, cert = d / "key.pem", d / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return TlsFiles(cert.read_bytes(), key.read_bytes())


def _actors_of_a_deployment(secret: ClusterSecret, tls: TlsFiles | None = None) -> LauncherConfig:
    config = LauncherConfig(local_nodes=1, secret=secret, api_key=API_KEY, tls=tls)
    make_metadata_actor("127.0.0.1", 0, "memory", 10.0, NodeSecret.of(secret, None), "127.0.0.1", tls)
    make_router_actor(config, "127.0.0.1:1", "127.0.0.1")
    make_agent_actor(config.agent_config(NODE, "127.0.0.1:1", "127.0.0.1"), AgentPlacement.simulated(NODE),
                     NodeSecret.of(secret, None))
    return config


def test_no_actor_argument_carries_the_secret_or_a_key_derived_from_it(secret: ClusterSecret,
                                                                       shipped: _FakeRemote) -> None:
    _actors_of_a_deployment(secret)
    assert [cls for cls, _ in shipped.shipped] == [MetadataActor, RouterActor, AgentActor]
    for cls, blob in shipped.shipped:
        for form in _secret_forms(secret):
            assert form not in blob, f"{cls.__name__}'s arguments carry the secret or a key of it"


def test_no_actor_argument_carries_the_api_key_or_the_tls_private_key(secret: ClusterSecret, tls: TlsFiles,
                                                                     shipped: _FakeRemote) -> None:
    _actors_of_a_deployment(secret, tls)
    body = b"".join(tls.private_key.split(b"\n")[1:-2])  # the base64 lines, without the PEM armour
    for cls, blob in shipped.shipped:
        for form in (API_KEY.encode(), tls.private_key, body[:64], body[-64:]):
            assert form not in blob, f"{cls.__name__}'s arguments carry the API key or the TLS private key"
    assert stat.S_IMODE(api_key_path().stat().st_mode) == stat.S_IMODE(tls_key_path().stat().st_mode) == 0o600


def test_the_router_serves_with_the_api_key_and_the_metadata_service_with_the_tls_key_they_load(
        secret: ClusterSecret, tls: TlsFiles, shipped: _FakeRemote) -> None:
    _actors_of_a_deployment(secret, tls)
    args = {cls: cloudpickle.loads(blob) for cls, blob in shipped.shipped}
    asyncio.run(_metadata_serves_over_tls(MetadataActor(*args[MetadataActor]), secret, tls))
    asyncio.run(_router_serves_with_the_key(RouterActor(*args[RouterActor])))


async def _metadata_serves_over_tls(actor: MetadataActor, secret: ClusterSecret, tls: TlsFiles) -> None:
    address = await actor.start()
    try:
        async with MetadataClient(address, credentials=CallerCredentials.cluster(secret),
                                  root_certificates=tls.cert_chain, timeout_s=10.0) as client:
            assert (await client.stats()).live_nodes == 0
    finally:
        await actor.stop()


class _OneAgent:
    """Stands in for the router's AgentReconciler: one agent of the tiny model is in, none is started."""

    def __init__(self) -> None:
        self.infos = {NODE: NodeInfo(NODE, 1, "layout", 16, 4096, "127.0.0.1:1", 8)}
        self.directory = StaticAgentDirectory([])

    async def until_any(self, _interval_s: float) -> None:
        pass

    def follow(self, _interval_s: float) -> None:
        pass

    async def close(self) -> None:
        pass

    async def stop_all(self) -> None:
        pass


async def _router_serves_with_the_key(actor: RouterActor) -> None:
    actor._reconciler = _OneAgent()  # type: ignore[assignment]
    url = await actor.start()
    assert url.startswith("https://")
    trusting = ssl.create_default_context(cadata=actor._config.tls.cert_chain.decode())  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=trusting)) as http:
            async with http.get(f"{url}/v1/models") as r:
                assert r.status == 401
            async with http.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}) as r:
                assert r.status == 200, await r.text()
    finally:
        await actor.stop()
        await close_router(actor)


async def close_router(actor: RouterActor) -> None:
    """Close what the actor's `start` built and its `stop` leaves to the actor's process ending: the
    router's index watch and prediction reports, and its metadata client. Here that process is the
    test worker: a grpc.aio channel left open past this test's event loop later had its cancelled
    calls' completions delivered to another test's loop, failing that test with "Event loop is
    closed" (tests/cluster/api/test_http_api.py's, at setup)."""
    router = actor._router
    if router is not None:
        await router.close()
        if router.metadata is not None:
            await router.metadata.close()


def test_an_actor_refuses_a_missing_or_shared_key_file(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    loader = NodeKey.staged(path, API_KEY, "the API key")
    assert loader() == API_KEY
    path.chmod(0o640)
    with pytest.raises(ValueError, match="the API key: .* accessible to other users"):
        loader()
    path.unlink()
    with pytest.raises(ValueError, match="the API key: cannot read"):
        loader()


def test_each_actor_loads_the_secret_on_its_node(secret: ClusterSecret, shipped: _FakeRemote) -> None:
    _actors_of_a_deployment(secret)
    actors = {cls: cls(*cloudpickle.loads(blob)) for cls, blob in shipped.shipped}
    assert actors[MetadataActor]._secret == secret
    assert actors[RouterActor]._config.secret == secret
    agent = actors[AgentActor]._config
    assert agent.secret == secret and agent.engine.memory.hash_key == secret.hash_key()


def test_an_actor_refuses_a_missing_shared_or_foreign_secret(secret: ClusterSecret) -> None:
    loader = NodeSecret.of(secret, None)
    path = default_secret_path()
    path.chmod(0o644)
    with pytest.raises(ValueError, match="accessible to other users"):
        loader()
    path.unlink()
    with pytest.raises(ValueError, match="cannot read"):
        loader()
    create_secret(path)  # another deployment's secret on this node
    with pytest.raises(ValueError, match="not the one `radixmesh up` runs with"):
        loader()
    with pytest.raises(ValueError, match="not the one"):
        AgentActor(LauncherConfig(secret=secret).agent_config(NODE, "127.0.0.1:1", "127.0.0.1"), loader)


def _connect(address: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A GCS call from another process (what every Ray driver, worker and CLI makes first)."""
    code = (f"from ray._raylet import GcsClient; GcsClient(address={address!r}).internal_kv_keys(b'', namespace=None, "
            "timeout=10); print('joined')")
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                          timeout=120, check=False)


def test_local_ray_answers_only_callers_with_its_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXMESH_HOME", str(tmp_path))
    monkeypatch.delenv(SECRET_ENV, raising=False)  # init_local_ray sets it: restored after the test
    saved = {k: os.environ.get(k) for k in (AUTH_MODE_ENV, TOKEN_PATH_ENV)}
    os.environ[AUTH_MODE_ENV] = "disabled"  # Ray's own opt-out does not open radixmesh's Ray
    try:
        launcher.init_local_ray(LauncherConfig(local_nodes=1))
        token = ray_token_path()
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        address = ray.get_runtime_context().gcs_address
        for stranger in ({AUTH_MODE_ENV: "token", "RAY_AUTH_TOKEN": "0" * 64}, {AUTH_MODE_ENV: "disabled"}):
            refused = _connect(address, stranger)
            assert "joined" not in refused.stdout and "token-auth" in refused.stderr, (stranger, refused.stderr[-2000:])
        holder = _connect(address, {AUTH_MODE_ENV: "token", TOKEN_PATH_ENV: str(token)})
        assert "joined" in holder.stdout, holder.stderr[-2000:]
    finally:
        ray.shutdown()
        for k, v in saved.items():  # a later Ray in this process must not look for this token
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]
        AuthenticationTokenLoader.instance().reset_cache()
