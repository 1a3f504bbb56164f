"""deploy/kuberay/raycluster.yaml: valid against KubeRay's RayCluster schema (tests/data/kuberay, with
unknown fields refused, so a misspelled field fails here instead of being dropped by the API server),
and running radixmesh as the `ray up` files do: the same `radixmesh up`, Redis, agent resource,
secrets taken from a Kubernetes Secret, and Ray's mutual TLS of the cluster CA in every pod (its
initContainer's command run here for real)."""

import copy
import functools
import json
import os
import re
import shlex
import ssl
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import pytest
import yaml
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store

from radixmesh.cluster.cli.route_stats import API_KEY_ENV
from radixmesh.cluster.launch.reconcile import AGENT_RESOURCE, ROLE_RESOURCES, node_role
from radixmesh.cluster.launch.secret_file import SECRET_ENV
from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.common.secret import ClusterSecret

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "deploy" / "kuberay" / "raycluster.yaml"
SCHEMA = ROOT / "tests" / "data" / "kuberay" / "raycluster-v1.schema.json"
RAY_UP = ROOT / "deploy" / "cluster.yaml"
LOCAL_RAY_UP = ROOT / "deploy" / "local-cluster.yaml"
TOKEN_AUTH_MIN_RAY = (2, 52, 0)
"""The least Ray KubeRay accepts with `authOptions.mode: token`."""
TLS_FILES = {"RAY_TLS_SERVER_CERT": "node.pem", "RAY_TLS_SERVER_KEY": "node.key", "RAY_TLS_CA_CERT": "ca.pem"}
"""The variables Ray reads its TLS files from, and the names `radixmesh ray-tls --dir` writes."""
HEAD_SERVICE = "radixmesh-head-svc.default.svc.cluster.local"
"""What KubeRay sets FQ_RAY_IP to in every initContainer (namespace `default`): workers dial the GCS by it."""


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as jsonschema should apply it to a manifest: an object schema with `properties`
    refuses other fields (the API server would silently prune them) unless it sets
    x-kubernetes-preserve-unknown-fields; the other x-kubernetes-* extensions are dropped (the
    schema spells int-or-string as anyOf integer/string itself, and its CEL rules are not run)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-"):
            continue
        if key == "properties":
            value = {name: closed(sub) for name, sub in value.items()}
        elif key in ("anyOf", "allOf", "oneOf"):
            value = [closed(sub) for sub in value]
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            value = closed(value)
        out[key] = value
    if "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.cache
def raycluster_validator() -> jsonschema.Draft7Validator:
    schema = closed(json.loads(SCHEMA.read_text()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def manifest() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return loaded


def errors(document: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in raycluster_validator().iter_errors(document)]


def head(document: dict[str, Any]) -> dict[str, Any]:
    """The head's Ray container (KubeRay runs Ray in the first one)."""
    container: dict[str, Any] = document["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return container


def group(document: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [g for g in document["spec"]["workerGroupSpecs"] if g["groupName"] == name]
    return found


def options(args: list[str]) -> dict[str, str]:
    """The options of a command line: `--name value` pairs (values taken as given) and bare
    `--flag`s (value "")."""
    out: dict[str, str] = {}
    while args:
        name, *args = args
        assert name.startswith("--"), name
        out[name] = args.pop(0) if args and not args[0].startswith("--") else ""
    return out


def up_options(command: str) -> dict[str, str]:
    """The options of the `radixmesh up` in a shell command (it ends the quoted `bash -c` script)."""
    [args] = re.findall(r"radixmesh up ([^'\n]*)'", command)
    return options(shlex.split(args))


def head_command() -> str:
    [command] = head(manifest())["command"]
    assert isinstance(command, str)
    return command


def ray_up_head_commands(path: Path) -> str:
    return "\n".join(yaml.safe_load(path.read_text())["head_start_ray_commands"])


def test_manifest_is_a_raycluster_valid_against_kuberays_schema() -> None:
    document = manifest()
    assert (document["apiVersion"], document["kind"]) == ("ray.io/v1", "RayCluster")
    assert errors(document) == []


@pytest.mark.parametrize(("path", "field", "typo"), [
    (("spec",), "workerGroupSpecs", "workerGroupSpec"),
    (("spec", "headGroupSpec"), "rayStartParams", "rayStartParam"),
    # A misspelled `resources` would drop the GPU limit: the agents would get no GPU.
    (("spec", "workerGroupSpecs", 0, "template", "spec", "containers", 0), "resources", "resource"),
    (("spec", "headGroupSpec", "template", "spec", "containers", 0, "env", 0), "valueFrom", "valuefrom"),
])
def test_a_misspelled_field_fails_validation(path: tuple[str | int, ...], field: str, typo: str) -> None:
    document = copy.deepcopy(manifest())
    parent: Any = document
    for step in path:
        parent = parent[step]
    parent[typo] = parent.pop(field)
    found = errors(document)
    assert any(f"'{typo}' was unexpected" in e for e in found), found


def test_a_value_of_the_wrong_type_fails_validation() -> None:
    document = copy.deepcopy(manifest())
    group(document, "gpu")["replicas"] = "2"
    assert any("replicas: '2' is not of type 'integer'" in e for e in errors(document))


def test_closed_objects_refuse_unknown_fields_unless_told_to_keep_them() -> None:
    validator = jsonschema.Draft7Validator(closed({"type": "object", "properties": {
        "strict": {"type": "object", "properties": {"a": {"type": "string"}}},
        "open": {"type": "object", "properties": {"a": {"type": "string"}},
                 "x-kubernetes-preserve-unknown-fields": True},
        "map": {"type": "object", "additionalProperties": {"type": "string"}},
    }}))
    assert validator.is_valid({"strict": {"a": "x"}, "open": {"a": "x", "b": 1}, "map": {"any": "x"}})
    assert not validator.is_valid({"strict": {"a": "x", "b": 1}})
    assert not validator.is_valid({"strict": {}, "other": 1})
    assert not validator.is_valid({"map": {"any": 1}})


def test_every_int_or_string_in_the_schema_spells_its_two_types() -> None:
    # closed() drops x-kubernetes-int-or-string: the anyOf beside it must say the same.
    found = 0

    def walk(node: Any) -> None:
        nonlocal found
        if isinstance(node, dict):
            if node.get("x-kubernetes-int-or-string"):
                found += 1
                assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], node
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(SCHEMA.read_text()))
    assert found > 0


def test_head_runs_radixmesh_up_as_ray_up_does() -> None:
    command = head_command()
    assert up_options(command) == up_options(ray_up_head_commands(RAY_UP))
    # It waits, as local-cluster.yaml's head does, for a GPU or a CPU node that offers the agent resource.
    [wait] = re.findall(r"until (ray status \| grep [^;]*);", command)
    assert wait in ray_up_head_commands(LOCAL_RAY_UP) and AGENT_RESOURCE in wait
    assert command.startswith("(nohup ") and command.endswith("&)")  # in the background: Ray starts next
    # KubeRay starts Ray after this command only when the command does not mention `ray start` itself.
    assert "ray start" not in command


def test_router_port_is_a_port_of_the_head_pod() -> None:
    # The head Service KubeRay makes exposes the head container's ports.
    ports = {p["name"]: p["containerPort"] for p in head(manifest())["ports"]}
    assert ports["router"] == int(up_options(head_command())["--port"])
    assert ports["gcs-server"] == 6379


def test_redis_runs_beside_the_head_as_ray_up_starts_it() -> None:
    [redis] = [c for c in manifest()["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
               if c["name"] == "redis"]
    [ray_up_redis] = re.findall(r"--daemonize yes (--bind .*)$", ray_up_head_commands(RAY_UP), re.MULTILINE)
    assert options(redis["args"]) == options(shlex.split(ray_up_redis))
    assert up_options(head_command())["--state"] == f"redis://127.0.0.1:{options(redis['args'])['--port']}/0"


def test_secrets_come_from_a_kubernetes_secret_never_the_manifest() -> None:
    document = manifest()
    env = {e["name"]: e for e in head(document)["env"]}
    for name in (SECRET_ENV, API_KEY_ENV):
        assert "value" not in env[name]
        assert set(env[name]["valueFrom"]["secretKeyRef"]) == {"name", "key"}
    assert not re.search(r"[0-9a-fA-F]{32}", MANIFEST.read_text())  # no pasted secret or token
    # Ray's own token auth, which KubeRay accepts from Ray 2.52 on.
    assert document["spec"]["authOptions"] == {"mode": "token"}
    assert tuple(map(int, document["spec"]["rayVersion"].split("."))) >= TOKEN_AUTH_MIN_RAY
    # Agents load the secret on their own pod (never from Ray's actor arguments): every worker has it.
    for name in ("gpu", "cpu"):
        [worker] = group(document, name)["template"]["spec"]["containers"]
        [secret] = [e for e in worker["env"] if e["name"] == SECRET_ENV]
        assert "value" not in secret and set(secret["valueFrom"]["secretKeyRef"]) == {"name", "key"}


def test_gpu_group_offers_gpus_and_cpu_group_the_agent_resource() -> None:
    document = manifest()
    gpu, cpu = group(document, "gpu"), group(document, "cpu")
    assert int(gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert AGENT_RESOURCE not in gpu.get("resources", {})  # one agent per GPU, not one more per pod
    assert cpu["resources"] == {AGENT_RESOURCE: "1"}
    assert "nvidia.com/gpu" not in cpu["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_prefill_and_decode_groups_are_the_gpu_group_with_a_role_marker() -> None:
    document = manifest()
    gpu = group(document, "gpu")
    for name, role in (("gpu-prefill", "prefill"), ("gpu-decode", "decode")):
        split = group(document, name)
        # The marker the launcher reads (reconcile.ROLE_RESOURCES) is the group's one Ray resource.
        assert split["resources"] == {ROLE_RESOURCES[role]: "1"}
        assert node_role({k: float(v) for k, v in split["resources"].items()}) == role
        # Otherwise the gpu group: its pods (one agent per GPU), its Ray parameters and its limit.
        assert split["template"] == gpu["template"] and split["rayStartParams"] == gpu["rayStartParams"]
        assert split["maxReplicas"] == gpu["maxReplicas"]
        # Aggregated stays the default: no pod of a role unless scaled.
        assert split["replicas"] == split["minReplicas"] == 0
    assert gpu["replicas"] >= 1 and "resources" not in gpu
    # Roles come from the nodes: the head's `radixmesh up` splits no --local agents.
    assert not {"--prefill", "--decode", "--local"} & set(up_options(head_command()))


def test_every_ray_container_runs_the_same_image() -> None:
    document = manifest()
    images = {head(document)["image"]} | {g["template"]["spec"]["containers"][0]["image"]
                                           for g in document["spec"]["workerGroupSpecs"]}
    assert len(images) == 1, images


def pod_specs(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each pod template's spec: the head's, then each worker group's by its name."""
    return {"head": document["spec"]["headGroupSpec"]["template"]["spec"],
            **{g["groupName"]: g["template"]["spec"] for g in document["spec"]["workerGroupSpecs"]}}


class RayTls:
    """What one pod template says about Ray's TLS: the folder its Ray container reads, the volume
    mount holding it, and the initContainer that writes it."""

    def __init__(self, pod: dict[str, Any]) -> None:
        ray = pod["containers"][0]  # KubeRay runs Ray in the first container
        env = {e["name"]: e for e in ray["env"]}
        assert env["RAY_USE_TLS"] == {"name": "RAY_USE_TLS", "value": "1"}
        paths = {PurePosixPath(env[name]["value"]) for name in TLS_FILES}
        assert {p.name for p in paths} == set(TLS_FILES.values())
        [self.folder] = {p.parent for p in paths}
        [self.mount] = [m for m in ray["volumeMounts"] if self.folder.is_relative_to(m["mountPath"])]
        [self.volume] = [v for v in pod["volumes"] if v["name"] == self.mount["name"]]
        [self.init] = [c for c in pod["initContainers"] if c["command"][:2] == ["radixmesh", "ray-tls"]]
        self.options = options(self.init["command"][2:])

    def env_in(self, volume: Path) -> dict[str, Path]:
        """The Ray container's TLS paths with the volume's mount path mapped to `volume`."""
        mount = PurePosixPath(self.mount["mountPath"])
        return {name: volume / (self.folder / file).relative_to(mount) for name, file in TLS_FILES.items()}


@pytest.mark.parametrize("name", ["head", "gpu", "cpu"])
def test_every_ray_container_reads_rays_tls_files_its_init_container_writes(name: str) -> None:
    pod = pod_specs(manifest())[name]
    tls = RayTls(pod)
    # The folder lives in a volume of the pod alone, in memory, which Ray only reads.
    assert tls.volume == {"name": tls.mount["name"], "emptyDir": {"medium": "Memory"}}
    assert tls.mount["readOnly"] is True
    # The initContainer writes that folder into the same volume, at the same path.
    assert PurePosixPath(tls.options["--dir"]) == tls.folder
    assert [m for m in tls.init["volumeMounts"] if m["name"] == tls.mount["name"]] == [
        {"name": tls.mount["name"], "mountPath": tls.mount["mountPath"]}]
    # From the cluster secret, out of the Kubernetes Secret, as the Ray container gets it.
    [secret] = tls.init["env"]
    assert secret["name"] == SECRET_ENV and set(secret["valueFrom"]["secretKeyRef"]) == {"name", "key"}
    assert secret in pod["containers"][0]["env"]
    assert tls.init["image"] == pod["containers"][0]["image"]  # its user, who alone reads the 0700 folder
    # For the pod's own addresses (ray-tls finds them: an initContainer shares the pod's network); the
    # head's also for its Service, which workers dial the GCS by.
    assert "--address" not in tls.options
    assert tls.options.get("--also-address") == ("$(FQ_RAY_IP)" if name == "head" else None)


def kubelet_args(command: list[str], env: dict[str, str]) -> list[str]:
    """`command` with $(VAR) expanded from `env` as the kubelet does (an unknown one stays as written)."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg) for arg in command]


def run_init_container(tls: RayTls, volume: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The pod's ray-tls initContainer, for real: this checkout's `radixmesh` with the volume's mount
    path mapped to `volume`, in `env` alone (as a container gets only its own variables)."""
    mount = tls.mount["mountPath"]
    args = [arg.replace(mount, str(volume), 1) if arg.startswith(mount) else arg
            for arg in kubelet_args(tls.init["command"], env)]
    path = f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin"
    return subprocess.run(args, env={**env, "PATH": path}, capture_output=True, text=True, timeout=120, check=False)


# cpu's initContainer is gpu's (one YAML anchor; the test above checks each pod): run once.
@pytest.mark.parametrize("name", ["head", "gpu"])
def test_the_init_container_writes_exactly_the_files_ray_reads_of_the_clusters_ca(name: str, tmp_path: Path) -> None:
    tls = RayTls(pod_specs(manifest())[name])
    secret = ClusterSecret(bytes(range(32)))
    volume = tmp_path / "volume"
    volume.mkdir()
    volume.chmod(0o777)  # as the kubelet makes an emptyDir
    env = {SECRET_ENV: secret.to_hex(), "RADIXMESH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path),
           "FQ_RAY_IP": HEAD_SERVICE}  # KubeRay gives every initContainer FQ_RAY_IP
    done = run_init_container(tls, volume, env)
    assert done.returncode == 0, done.stderr
    files = tls.env_in(volume)
    folder = files["RAY_TLS_SERVER_CERT"].parent
    assert sorted(os.listdir(volume)) == [folder.name] and sorted(os.listdir(folder)) == sorted(TLS_FILES.values())
    assert not (tmp_path / "home").exists()  # nothing else written
    ca = ClusterCa.derive(secret).certificate
    assert files["RAY_TLS_CA_CERT"].read_bytes() == ca
    leaf, *chain = x509.load_pem_x509_certificates(files["RAY_TLS_SERVER_CERT"].read_bytes())
    verifier = PolicyBuilder().store(Store([x509.load_pem_x509_certificate(ca)]))
    verifier.build_client_verifier().verify(leaf, chain)  # Ray presents it as a client too; raises if not
    if name == "head":  # workers verify the name they dial the GCS by
        verifier.build_server_verifier(x509.DNSName(HEAD_SERVICE)).verify(leaf, chain)
    # The key is the certificate's (Ray's TLS would refuse them otherwise).
    ssl.create_default_context().load_cert_chain(files["RAY_TLS_SERVER_CERT"], files["RAY_TLS_SERVER_KEY"])
