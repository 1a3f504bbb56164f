"""What Ray's own mutual TLS costs (issue 38, item 16; docs/security.md#ray-between-hosts): the same calls
on a Ray started in plain text and on one started with RAY_USE_TLS and a certificate of the cluster CA
(`ray_tls_files` for 127.0.0.1, from a throwaway secret), token authentication on in both, as deployed.

Each run is a Ray of two raylets on 127.0.0.1 in a subprocess of its own (Ray reads its TLS variables
once per process): the head, where the driver runs, and a node offering `far`, where the actor lives,
so what moves between them crosses Ray's gRPC as it does between hosts.
  actor_call  a method call with a small argument on an existing actor, and its small result
  move_4mib   4 MiB of bytes put by the driver, passed to the actor and returned: the object crosses
              the two object managers there and back (on one raylet it would stay in shared memory,
              where TLS never sees it)
Runs go plain, TLS, TLS, plain (`--rounds 2`), so a box whose load drifts weighs on both arms alike.
bench/tls_cost.py measures radixmesh's own TLS (metadata gRPC, API, scrapes).

Usage: python bench/ray_tls_cost.py [--calls N] [--rounds R] [--out DIR] [--smoke]
Prints the figures, then one JSON object as the last line (also DIR/ray_tls_cost.json, default bench/results).
"""

import argparse
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import ray
from ray.cluster_utils import Cluster
from tls_cost import summary

from radixmesh.cluster.launch.local_ray import loopback_environment
from radixmesh.cluster.launch.ray_auth import require_ray_token
from radixmesh.cluster.launch.ray_tls import RayTlsFiles, ray_tls_files
from radixmesh.common.secret import ClusterSecret

HOST = "127.0.0.1"
CALLS, SMOKE_CALLS = 200, 3
ROUNDS = 2
MOVE_BYTES = 4 << 20
FAR = "far"
"""The resource only the second raylet offers: the actor lives there, the driver on the head."""
ARM_TIMEOUT_S = 600
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""What a plain-text gRPC client sends first: the HTTP/2 preface and an empty SETTINGS frame."""
INHERITED_RAY = ("RAY_ADDRESS", "RAY_USE_TLS", "RAY_TLS_", "RAY_AUTH_")
"""The caller's Ray variables an arm must not inherit: its TLS (or lack of it) and token are its own."""


class ArmRun(NamedTuple):
    """One run's figures, as its subprocess prints them (JSON)."""

    plain_text_answered: bool
    samples_us: dict[str, list[float]]
    """Per kind of call (actor_call, move_4mib), each timed call in microseconds."""


class Echo:
    """The actor on the far raylet: gives back what it is given."""

    def echo(self, value: object) -> object:
        return value

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def samples_us(call: Callable[[], object], calls: int) -> list[float]:
    """The times of `calls` sequential calls, in microseconds (after 3 unmeasured ones)."""
    for _ in range(3):
        call()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def answers_plain_text(address: str) -> bool:
    """Whether the GCS at `address` answers plain-text gRPC with a SETTINGS frame: the proof that the
    TLS arm measured TLS (a TLS server sends an alert, closes, or stays silent)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(HTTP2_PREFACE)
        try:
            reply = raw.recv(64)
        except (ConnectionResetError, TimeoutError):
            reply = b""
    return len(reply) >= 9 and reply[3] == 4


def run_arm(calls: int) -> ArmRun:
    """In an arm's subprocess: start the two raylets, time both calls, stop them."""
    require_ray_token()  # in the run's own $RADIXMESH_HOME
    cluster = Cluster(initialize_head=True, head_node_args={"node_ip_address": HOST, "num_cpus": 0,
                                                            "include_dashboard": False})
    try:
        cluster.add_node(node_ip_address=HOST, num_cpus=1, resources={FAR: 1})
        ray.init(address=cluster.address, log_to_driver=False)
        echo = ray.remote(Echo).options(num_cpus=0, resources={FAR: 1}).remote()
        if ray.get(echo.node.remote()) == ray.get_runtime_context().get_node_id():
            raise RuntimeError("the actor shares the driver's raylet: nothing would cross Ray's gRPC")
        payload = os.urandom(MOVE_BYTES)
        if ray.get(echo.echo.remote(ray.put(payload))) != payload:
            raise RuntimeError("the 4 MiB object came back changed")

        def move() -> None:
            # A new object each time: the far raylet keeps a copy of one it already pulled.
            ray.get(echo.echo.remote(ray.put(payload)))

        return ArmRun(answers_plain_text(cluster.address),
                      {"actor_call": samples_us(lambda: ray.get(echo.echo.remote(b"ping")), calls),
                       "move_4mib": samples_us(move, calls)})
    finally:
        ray.shutdown()
        cluster.shutdown()


def arm_environment(home: Path, tls: RayTlsFiles | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(INHERITED_RAY)}
    env["RADIXMESH_HOME"] = str(home)
    env.update(loopback_environment(env))  # every raylet on 127.0.0.1, as the project's own Rays
    return {**env, **(tls.environment() if tls is not None else {})}


def spawn_arm(calls: int, env: dict[str, str]) -> subprocess.Popen[str]:
    """This script with --arm-calls in `env`: one run of one arm, in a process of its own."""
    return subprocess.Popen([sys.executable, __file__, "--arm-calls", str(calls)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def arm_run(proc: subprocess.Popen[str]) -> ArmRun:
    """What an arm's process printed, once it has ended."""
    try:
        stdout, stderr = proc.communicate(timeout=ARM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"an arm exited {proc.returncode}:\n{stderr[-4000:]}")
    answered, samples = json.loads(stdout.strip().splitlines()[-1])
    return ArmRun(answered, samples)


def main(calls: int, rounds: int, at_once: bool = False) -> dict[str, object]:
    """`at_once`: the runs side by side, each its own Ray (a smoke: its figures are not a measurement)."""
    load_before = os.getloadavg()
    samples: dict[str, dict[str, list[float]]] = {"actor_call": {"plain": [], "tls": []},
                                                  "move_4mib": {"plain": [], "tls": []}}
    runs: list[dict[str, object]] = []  # each run's own p50s: how far runs of one arm spread
    with tempfile.TemporaryDirectory() as d:
        tls = ray_tls_files(ClusterSecret(secrets.token_bytes(32)), [HOST], Path(d) / "ray-tls")
        order = [arm for r in range(rounds) for arm in (("plain", "tls") if r % 2 == 0 else ("tls", "plain"))]
        procs: list[subprocess.Popen[str]] = []
        arm_runs: list[ArmRun] = []
        try:
            for i, arm in enumerate(order):
                procs.append(spawn_arm(calls, arm_environment(Path(d) / f"home-{i}", tls if arm == "tls" else None)))
                if not at_once:  # one run at a time: neither loads the box under the other
                    arm_runs.append(arm_run(procs[-1]))
            arm_runs += [arm_run(proc) for proc in procs[len(arm_runs):]]
        finally:
            for proc in procs:  # an arm that failed leaves none running
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        for arm, run in zip(order, arm_runs, strict=True):
            if run.plain_text_answered != (arm == "plain"):
                raise RuntimeError(f"the {arm} arm's GCS {'did not answer' if arm == 'plain' else 'answered'} "
                                   "plain text: it did not run as the arm says")
            for name, times in run.samples_us.items():
                samples[name][arm] += times
            runs.append({"arm": arm, **{f"{name}_p50_us": summary(times)["p50_us"]
                                        for name, times in run.samples_us.items()}})
    result: dict[str, object] = {"calls": calls, "rounds": rounds, "move_bytes": MOVE_BYTES, "host": HOST,
                                 "ray": ray.__version__, "python": platform.python_version()}
    for name, arms in samples.items():
        plain, tls_figures = summary(arms["plain"]), summary(arms["tls"])
        result[name] = {"plain": plain, "tls": tls_figures,
                        "ratio_p50_tls_vs_plain": round(tls_figures["p50_us"] / plain["p50_us"], 2),
                        "ratio_p90_tls_vs_plain": round(tls_figures["p90_us"] / plain["p90_us"], 2)}
    result["runs"] = runs
    result["machine"] = {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                         "load_avg_before": load_before, "load_avg_after": os.getloadavg()}
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=CALLS, help="timed calls of each kind per run")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="pairs of runs: plain and TLS, then TLS and plain, ...")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results", help="folder for ray_tls_cost.json")
    ap.add_argument("--smoke", action="store_true",
                    help=f"tiny run: one run per arm, both at once, {SMOKE_CALLS} calls of each kind")
    ap.add_argument("--arm-calls", type=int, default=None, help=argparse.SUPPRESS)  # one arm, in its subprocess
    args = ap.parse_args()
    if args.arm_calls is not None:
        print(json.dumps(run_arm(args.arm_calls)))
        sys.exit(0)
    result = main(SMOKE_CALLS, 1, at_once=True) if args.smoke else main(args.calls, args.rounds)
    for key, value in result.items():
        if isinstance(value, list):
            print("\n".join(f"{key:11s} {run}" for run in value))
        elif isinstance(value, dict) and "plain" in value:
            plain, tls = value["plain"], value["tls"]
            print(f"{key:11s} plain p50 {plain['p50_us']:9.1f} p90 {plain['p90_us']:9.1f} us   "
                  f"tls p50 {tls['p50_us']:9.1f} p90 {tls['p90_us']:9.1f} us   "
                  f"ratio p50 {value['ratio_p50_tls_vs_plain']:.2f} p90 {value['ratio_p90_tls_vs_plain']:.2f}")
        else:
            print(f"{key:11s} {value}")
    if args.smoke:
        result["smoke"] = True
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ray_tls_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
