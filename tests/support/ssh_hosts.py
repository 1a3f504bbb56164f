"""An sshd per namespace host, so `ray up` reaches the hosts the way it reaches real machines.

Each host is provisioned like a machine image: /usr/local (mounted over, in the host's own mount
namespace) is a venv whose `python3` already has this test's dependencies (its .pth adds the test
virtualenv's site-packages), with a `ray` command on that Python and a redis-server in its bin. Login shells put /usr/local/bin first, as on any Debian machine. The cluster YAML then
installs the checkout into that Python itself. The hosts have no route out, so pip installs only
from what the image holds. /root, root's home, is one folder shared by every host (an NFS home, as on
many clusters: Ray's auth token and the synced checkout are seen by every host); it must be the
passwd home, because ssh expands the `~` of Ray's `-i ~/ray_bootstrap_key.pem` from passwd, not $HOME.

Keys are made here: one client key (what `ray up` gets as ssh_private_key) and one host key.
"""

import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.netns_hosts import Host, HostNetwork

SSHD = Path("/usr/sbin/sshd")


@dataclass(frozen=True, slots=True)
class Keys:
    client: Path
    host: Path


def make_keys(directory: Path) -> Keys:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("client", "host"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"radixmesh-test-{name}",
                        "-f", str(directory / name)], check=True)
    return Keys(directory / "client", directory / "host")


IMAGE_MOUNT = Path("/usr/local")


def make_image(directory: Path, redis_server: str) -> Path:
    """A host's /usr/local (see the module docstring), made in `directory`; returns `directory`."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    bin_dir = directory / "bin"
    site = Path(sysconfig.get_path("purelib", vars={"base": str(directory), "platbase": str(directory)}))
    test_site = sysconfig.get_path("purelib")
    # addsitedir (not a bare path line) so the test venv's own .pth files are processed too.
    (site / "_radixmesh_host_image.pth").write_text(f"import site; site.addsitedir({test_site!r})\n")
    (bin_dir / "ray").write_text(f"#!{IMAGE_MOUNT / 'bin' / 'python3'}\nimport sys\n"
                                 "from ray.scripts.scripts import main\nsys.exit(main())\n")
    (bin_dir / "ray").chmod(0o755)
    (bin_dir / "redis-server").symlink_to(redis_server)
    return directory


def sshd_config(host: Host, keys: Keys, env: dict[str, str]) -> str:
    # SetEnv values are one word each (sshd splits on spaces): every value here has none.
    assert all(" " not in v and '"' not in v for v in env.values()), env
    return "\n".join([
        f"ListenAddress {host.address}",
        f"HostKey {keys.host}",
        f"AuthorizedKeysFile {keys.client}.pub",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",  # the key files live in a test folder, not in ~/.ssh
        "MaxStartups 100",  # Ray opens several sessions at once
        "SetEnv " + " ".join(f"{k}={v}" for k, v in sorted(env.items())),
        "",
    ])


HOME = Path("/root")
TMP = Path("/tmp")
CHECKOUT = Path(__file__).resolve().parents[2]
"""The repository under test (its venv's editable install points into it)."""


def start_sshd(network: HostNetwork, host: Host, keys: Keys, image: Path, home: Path, tmp: Path,
               env: dict[str, str], log: Path) -> None:
    """Run sshd in `host` with its own PID namespace (so `ray stop` there stops only this host's
    Ray) and mount namespace: `image` on /usr/local, `home` on /root, `tmp` on /tmp (its own, for
    Ray's session files). `env` is every session's environment. Returns once it accepts
    connections."""
    config = log.with_suffix(".conf")
    config.write_text(sshd_config(host, keys, env))
    tmp.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    # The interpreter may live under /root (pyenv), the checkout and its venv under /tmp (a CI clone):
    # keep them visible through the home and the tmp mounted over those folders.
    keep = [p for p in {Path(sys.base_prefix).resolve()} if p.is_relative_to(HOME)]
    keep_tmp = [p for p in {Path(sys.prefix).resolve(), CHECKOUT} if p.is_relative_to(TMP)]
    mounts = [(p, home / p.relative_to(HOME)) for p in keep] + [(p, tmp / p.relative_to(TMP)) for p in keep_tmp]
    mounts += [(image, IMAGE_MOUNT), (home, HOME), (tmp, TMP)]
    for _, target in mounts:
        if target.is_relative_to(home) or target.is_relative_to(tmp):
            target.mkdir(parents=True, exist_ok=True)
    script = " && ".join([*(f"mount --rbind {src} {dst}" for src, dst in mounts), f"exec {SSHD} -D -e -f {config}"])
    network.popen(host, ["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", script],
                  stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection((host.address, 22), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"sshd on {host.address} did not start: {log.read_text()}") from None
            time.sleep(0.05)  # sshd binds within milliseconds; polling its port is the readiness check
