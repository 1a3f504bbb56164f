"""A radixmesh cluster brought up by `ray up deploy/local-cluster.yaml` on namespace hosts.

Host 0 is the head (Ray head, Redis, metadata service, router at https://198.18.0.1:8000), hosts
1..N are workers (one CPU agent each, through the YAML's `radixmesh_agent` resource). The YAML is
the repository's, with only its host list (provider head_ip / worker_ips) and the SSH login (root,
the key made here) substituted.

A host that joins later runs the YAML's file mount, setup and worker start commands itself (`join`),
as an operator does: Ray's local provider fixes its host list when the head's autoscaler starts
(StandardAutoscaler makes its NodeProvider once), so `ray up --no-restart` with a longer list
uploads it but is never acted on, and a plain `ray up` restarts the whole cluster.
"""

import contextlib
import json
import os
import secrets
import shlex
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, TypeVar

import yaml

from radixmesh.cluster.launch.secret_file import create_secret, write_private
from tests.support.netns_hosts import Host, HostNetwork
from tests.support.ssh_hosts import Keys, make_image, make_keys, start_sshd

REPO = Path(__file__).resolve().parents[2]
ROUTER_PORT = 8000
T = TypeVar("T")


class RayUpCluster:
    """Owns the network, the hosts' sshds and everything `ray up` starts on them; `close` ends it all."""

    def __init__(self, workdir: Path, prefix: str, redis_server: str) -> None:
        self.workdir = workdir
        self.redis_server = redis_server
        self.home = workdir / "home"
        self.home.mkdir()
        # Ray's SSH commands start with `source ~/.bashrc`; this home's is empty.
        (self.home / ".bashrc").write_text("# radixmesh multi-host test home\n")
        self.keys: Keys = make_keys(workdir / "keys")
        # What an operator makes before the first `ray up` (the YAML ships both to every host): Ray's
        # token and the cluster secret, in the home that `ray up` runs with (the hosts' too).
        write_private(self.home / ".ray" / "auth_token", secrets.token_hex(32))
        create_secret(self.home / ".radixmesh" / "secret")
        self.network = HostNetwork(prefix)
        self.ray_tmp = workdir / "ray-client-tmp"  # `ray up`'s own lock and local-provider state
        self.ray_tmp.mkdir()

    def close(self) -> None:
        self.network.close()

    @property
    def hosts(self) -> list[Host]:
        return self.network.hosts

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def router_url(self) -> str:
        return f"https://{self.head.address}:{ROUTER_PORT}"  # TLS by default beyond loopback

    def add_host(self) -> Host:
        """A new host with sshd running (not yet in the cluster: `ray_up` after it)."""
        host = self.network.add_host()
        base = self.workdir / f"host{host.index}"
        image = make_image(base / "python", self.redis_server)
        env = {"RAY_USAGE_STATS_ENABLED": "0",
               # The hosts have no route out: pip installs only from what the image holds.
               "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               # A simulated host stands for a machine of its own: its agent must not be priced as
               # sharing cores with the others (they share this machine's, as real hosts would not).
               "RADIXMESH_COMPUTE_GROUP": f"simulated-host-{host.index}"}
        start_sshd(self.network, host, self.keys, image, self.home, base / "tmp", env, base / "sshd.log")
        return host

    def cluster_yaml(self) -> Path:
        """deploy/local-cluster.yaml with this cluster's host list and SSH login."""
        config = yaml.safe_load((REPO / "deploy" / "local-cluster.yaml").read_text())
        config["provider"]["head_ip"] = self.head.address
        config["provider"]["worker_ips"] = [h.address for h in self.hosts[1:]]
        config["auth"] = {"ssh_user": "root", "ssh_private_key": str(self.keys.client)}
        path = self.workdir / "cluster.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def ray_up(self, timeout_s: float = 240) -> None:
        """`ray up` from the checkout (its file_mounts sync "."); raises with the output on failure."""
        argv = [str(Path(sys.executable).parent / "ray"), "up", "-y",
                "--no-config-cache", str(self.cluster_yaml())]
        # HOME: the YAML's `~/...` file mounts are read from this cluster's home, not the tester's.
        env = {**os.environ, "HOME": str(self.home), "RAY_TMPDIR": str(self.ray_tmp), "RAY_USAGE_STATS_ENABLED": "0"}
        done = subprocess.run(argv, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
        (self.workdir / "ray-up.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"ray up failed ({done.returncode}):\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}")

    def ssh(self, host: Host) -> list[str]:
        return ["ssh", "-i", str(self.keys.client), "-o", "StrictHostKeyChecking=no", "-o",
                "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", f"root@{host.address}"]

    def join(self, host: Host, timeout_s: float = 240) -> None:
        """Make `host` a Ray worker by the YAML's own recipe: sync the checkout (its file_mounts,
        with its rsync filters), run setup_commands, then worker_start_ray_commands with
        RAY_HEAD_IP set, each in a login shell as Ray's command runner does."""
        config = yaml.safe_load(self.cluster_yaml().read_text())
        for target, source in config["file_mounts"].items():
            local = self.home / source[2:] if source.startswith("~/") else (REPO / source).resolve()
            slash = "/" if local.is_dir() else ""
            rsync = ["rsync", "-a", "--delete", "-e", " ".join(self.ssh(host)[:-1]),
                     *(f"--filter=dir-merge,- {f}" for f in config.get("rsync_filter", [])),
                     *(f"--exclude={x}" for x in config.get("rsync_exclude", [])),
                     f"{local}{slash}", f"root@{host.address}:{target}{slash}"]
            subprocess.run(rsync, check=True, capture_output=True, timeout=timeout_s)
        for command in [*config["setup_commands"], *config["worker_start_ray_commands"]]:
            script = f"export RAY_HEAD_IP={self.head.address}; {command}"
            done = subprocess.run([*self.ssh(host), "bash", "--login", "-c", shlex.quote(script)], check=False,
                                  capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0:
                raise RuntimeError(f"{command!r} failed on {host.address}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    def agent_actors(self) -> set[str]:
        """Names of the agent actors alive in the Ray cluster, asked on the head (a Ray driver there)."""
        code = ("import json, ray; ray.init(address='auto', logging_level='ERROR'); "
                "print(json.dumps([a['name'] for a in ray.util.list_named_actors(all_namespaces=True)]))")
        # Ray reads RAY_AUTH_MODE and its TLS variables when it is imported: set in the driver's
        # environment, not in its code, as the YAML's own drivers do.
        command = f'eval "$(radixmesh ray-tls)" && RAY_AUTH_MODE=token python3 -c {shlex.quote(code)}'
        done = subprocess.run([*self.ssh(self.head), "bash", "--login", "-c", shlex.quote(command)],
                              check=False, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"listing the actors on the head failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return {n for n in json.loads(done.stdout.strip().splitlines()[-1]) if n.startswith("radixmesh-agent-")}

    def logs(self) -> str:
        """The tails of the `radixmesh up` log and of the autoscaler's, for failure messages."""
        parts = []
        logs = self.workdir.glob("host0/tmp/ray/session_2*/logs")
        for path in [self.home / "radixmesh-up.log", *sorted(p for d in logs for p in d.glob("monitor.*")),
                     *sorted(p for d in logs for p in d.glob("worker-*.err"))]:
            with contextlib.suppress(OSError):
                text = path.read_text()
                if path.name.startswith("worker-") and "RouterActor" not in text:
                    continue  # the router actor's log holds the reconcile loop's
                parts.append(f"--- {path}\n{text[-3000:]}")
        return "\n".join(parts)

    def _authorized(self, path: str, body: bytes | None = None) -> urllib.request.Request:
        """A request with the API key the YAML's head made (~/.radixmesh/api_key)."""
        key = (self.home / ".radixmesh" / "api_key").read_text().strip()
        headers = {"Authorization": f"Bearer {key}", **({"Content-Type": "application/json"} if body else {})}
        return urllib.request.Request(f"{self.router_url}{path}", body, headers)

    def tls(self) -> ssl.SSLContext:
        """Trusts the CA whose certificate the head's `up` wrote (~/.radixmesh/tls/ca.pem, shared home)."""
        return ssl.create_default_context(cafile=str(self.home / ".radixmesh" / "tls" / "ca.pem"))

    def get(self, path: str, timeout_s: float = 10) -> Any:
        with urllib.request.urlopen(self._authorized(path), timeout=timeout_s, context=self.tls()) as r:
            return json.load(r)

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 120) -> Any:
        with urllib.request.urlopen(self._authorized(path, json.dumps(body).encode()), timeout=timeout_s,
                                    context=self.tls()) as r:
            return json.load(r)

    def metrics(self) -> str:
        with urllib.request.urlopen(self._authorized("/metrics"), timeout=10, context=self.tls()) as r:
            text: str = r.read().decode()
            return text

    def live_nodes(self) -> set[str]:
        """Nodes the metadata service holds a lease for (router /stats)."""
        stats = self.get("/stats")
        return {n for n, v in (stats.get("metadata") or {}).get("nodes", {}).items()}

