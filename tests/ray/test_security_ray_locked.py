"""Ray locked (issue 28, finding 3): no actor's arguments carry the cluster secret or a key derived
from it (Ray keeps them in its GCS, readable by anyone who reaches Ray); each actor loads the secret
on its own node from a 0600 file, and refuses one that is not the deployment's. The Ray that
`up --local` starts answers only callers with its token, kept in a 0600 file."""

import os
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import ray
from ray import cloudpickle

from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.cluster.launch.metadata_actor import MetadataActor, make_metadata_actor
from radixmesh.cluster.launch.ray_auth import AUTH_MODE_ENV, TOKEN_PATH_ENV, ray_token_path
from radixmesh.cluster.launch.router_actor import RouterActor, make_router_actor
from radixmesh.cluster.launch.secret_file import SECRET_ENV, NodeSecret, create_secret, default_secret_path
from radixmesh.common.secret import ClusterSecret, KeyPurpose
from radixmesh.node_agent.actor import AgentActor, AgentPlacement, make_agent_actor
from radixmesh.proto.ids import NodeId

pytestmark = pytest.mark.ray

NODE = NodeId("node-0")


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


def _actors_of_a_deployment(secret: ClusterSecret) -> LauncherConfig:
    config = LauncherConfig(local_nodes=1, secret=secret)
    make_metadata_actor("127.0.0.1", 0, "memory", 10.0, NodeSecret.of(secret, None), "127.0.0.1")
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
