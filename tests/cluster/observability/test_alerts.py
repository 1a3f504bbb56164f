"""deploy/alerts.yml: `promtool check rules` accepts it, `promtool test rules` fires each alert on
series written to trip it and keeps it quiet on series just short of that, and every metric a rule
reads is one radixmesh really exports (or Prometheus' own `up`)."""

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.router.metrics import RouterStats
from radixmesh.node_agent.engine.metrics import EngineStats
from radixmesh.node_agent.memory.disk.metrics import DiskStats
from radixmesh.node_agent.memory.metrics import MemoryStats
from radixmesh.node_agent.memory.zones.metrics import ZoneStats
from radixmesh.node_agent.metrics import AgentStats
from tests.support.router_cluster import MODEL_NAME, local_cluster

ALERTS = Path(__file__).resolve().parents[3] / "deploy" / "alerts.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but promtool is not on PATH: .ci/run installs it (Debian's prometheus package)")
        pytest.skip("promtool is not on PATH (it comes with Debian's `prometheus` package; CI installs it)")
    return exe


def rules() -> dict[str, str]:
    """Alert name -> its expression."""
    doc = yaml.safe_load(ALERTS.read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def exported_names() -> set[str]:
    """Every sample name radixmesh's stats dataclasses render (counters with _total, histograms' series)."""
    names = {"up"}
    for cls in (MemoryStats, DiskStats, ZoneStats, EngineStats, AgentStats, RouterStats):
        for name, f in cls.__dataclass_fields__.items():
            spec = f.metadata.get("metric")
            if spec is None:
                continue
            full = spec.family(name)
            if spec.kind == "counter":
                names.add(full + "_total")
            elif spec.kind == "histogram":
                names.update(full + s for s in ("_bucket", "_sum", "_count"))
            else:
                names.add(full)
    return names


def test_every_rule_reads_exported_metrics() -> None:
    exported = exported_names()
    for alert, expr in rules().items():
        used = set(re.findall(r"\b(radixmesh_[a-z_]+|up)\b(?=\s*[{\[)]|\s)", expr))
        assert used, alert
        assert used <= exported, f"{alert} reads {sorted(used - exported)}, which nothing exports"


def test_the_issue_alerts_are_all_there() -> None:
    assert {"RadixmeshGhostBlocks", "RadixmeshLargestFreeRunLow", "RadixmeshOOMRate", "RadixmeshMetadataServiceDown",
            "RadixmeshHitRateDrop", "RadixmeshAgentMissing", "RadixmeshDiskCorruptBlocks", "RadixmeshDiskWriteErrors",
            "RadixmeshDiskOffersDropped"} <= rules().keys()


def test_promtool_check_rules(promtool: str) -> None:
    run = subprocess.run([promtool, "check", "rules", str(ALERTS)], check=False, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(rules())} rules found" in run.stdout


NODE = 'node="a",tier="gpu"'
HITS = 'radixmesh_prompt_tokens_total{source="local_gpu"}'
MISSES = 'radixmesh_prompt_tokens_total{source="computed"}'
DISK = 'node="a",tier="disk"'
CORRUPT = f'radixmesh_disk_dropped_blocks_total{{{DISK},reason="corrupt"}}'
OFFERS_DROPPED = f"radixmesh_disk_offers_dropped_total{{{DISK}}}"
WRITES = f"radixmesh_disk_writes_total{{{DISK}}}"

# Each case: series (1-minute samples from time 0), the time the alert is evaluated at, and the
# alerts expected to be firing then (labels). Pairs trip the rule, then stay just short of it.
CASES: dict[str, tuple[dict[str, str], str, list[dict[str, str]]]] = {
    "ghost_bytes_for_5m": ({f"radixmesh_ghost_block_bytes{{{NODE}}}": "0 0 4096x10"}, "8m",
                           [{"node": "a", "tier": "gpu"}]),
    "ghost_bytes_for_3m_only": ({f"radixmesh_ghost_block_bytes{{{NODE}}}": "0x5 4096x3"}, "8m", []),
    "free_run_under_trigger_10m": ({f"radixmesh_largest_free_run_bytes{{{NODE}}}": "1000x20",
                                    f"radixmesh_gc_trigger_free_run_bytes{{{NODE}}}": "4096x20"}, "15m",
                                   [{"node": "a", "tier": "gpu"}]),
    "free_run_trigger_off": ({f"radixmesh_largest_free_run_bytes{{{NODE}}}": "0x20",
                              f"radixmesh_gc_trigger_free_run_bytes{{{NODE}}}": "0x20"}, "15m", []),
    "oom_rate": ({f'radixmesh_oom_total{{{NODE},reason="no_free_block"}}': "0+30x20"}, "15m",
                 [{"node": "a", "tier": "gpu", "reason": "no_free_block"}]),
    "oom_rare": ({f'radixmesh_oom_total{{{NODE},reason="no_free_block"}}': "0+3x20"}, "15m", []),
    "metadata_down": ({"radixmesh_metadata_available": "1 1 0x5"}, "5m", [{}]),
    "metadata_up": ({"radixmesh_metadata_available": "1x7"}, "5m", []),
    "agent_missing": ({'radixmesh_pool_utilization{node="a",tier="gpu"}': "0.5x10",
                       'radixmesh_pool_utilization{node="b",tier="gpu"}': "0.5x3 stale"}, "9m", [{"node": "b"}]),
    "agents_all_present": ({'radixmesh_pool_utilization{node="a",tier="gpu"}': "0.5x10",
                            'radixmesh_pool_utilization{node="b",tier="gpu"}': "0.5x10"}, "9m", []),
    # 80% hits for the first hour, then 20%: under half of 80% an hour later.
    "hit_rate_drop": ({HITS: "0+48000x60 2880000+12000x40", MISSES: "0+12000x60 720000+48000x40"}, "95m", [{}]),
    # 80% then 60%: lower, but not under half.
    "hit_rate_dip": ({HITS: "0+48000x60 2880000+36000x40", MISSES: "0+12000x60 720000+24000x40"}, "95m", []),
    "zone_watermark_high": ({'radixmesh_zone_watermark{node="a",zone="kv"}': "0.97x20"}, "15m",
                            [{"node": "a", "zone": "kv"}]),
    # An idle, warm agent (issue 40): weights at 100% by design, a prefix cache full of reusable blocks.
    "zone_watermark_idle": ({'radixmesh_zone_watermark{node="a",zone="weights"}': "1x20",
                             'radixmesh_zone_watermark{node="a",zone="prefix"}': "1x20",
                             'radixmesh_zone_watermark{node="a",zone="kv"}': "0x20"}, "15m", []),
    "router_down": ({'up{job="radixmesh",role="router",instance="r:8000"}': "1 0x5",
                     'up{job="radixmesh",role="agent",node="a",instance="a:9000"}': "1x5"}, "4m",
                    [{"job": "radixmesh", "role": "router", "instance": "r:8000"}]),
    "scrape_agent_down": ({'up{job="radixmesh",role="agent",node="a",instance="a:9000"}': "1 0x5",
                           'up{job="radixmesh",role="router",instance="r:8000"}': "1x5"}, "4m",
                          [{"job": "radixmesh", "role": "agent", "node": "a", "instance": "a:9000"}]),
    # Corrupt records: a rise within 15 minutes fires; one found by the scan of an agent whose series
    # is new fires too; the same count held for longer, or torn records, do not.
    "disk_corrupt_rise": ({CORRUPT: "0x10 2x10"}, "15m", [{"node": "a"}]),
    "disk_corrupt_on_start": ({CORRUPT: "_x10 2x10"}, "15m", [{"node": "a"}]),
    "disk_corrupt_old": ({CORRUPT: "0 2x30"}, "25m", []),
    "disk_corrupt_torn_only": ({f'radixmesh_disk_dropped_blocks_total{{{DISK},reason="torn"}}': "0x10 5x10",
                                CORRUPT: "0x20"}, "15m", []),
    "disk_write_errors": ({f"radixmesh_disk_write_errors_total{{{DISK}}}": "0x10 4x10"}, "15m", [{"node": "a"}]),
    "disk_write_errors_none": ({f"radixmesh_disk_write_errors_total{{{DISK}}}": "0x30"}, "25m", []),
    # A third of the offers dropped (1 of 3 blocks/s) for 25 minutes; a fortieth; a burst 3 minutes ago.
    "disk_offers_dropped_sustained": ({OFFERS_DROPPED: "0+60x30", WRITES: "0+120x30"}, "25m", [{"node": "a"}]),
    "disk_offers_dropped_few": ({OFFERS_DROPPED: "0+3x30", WRITES: "0+120x30"}, "25m", []),
    "disk_offers_dropped_burst": ({OFFERS_DROPPED: "0x10 600x20", WRITES: "0+120x30"}, "14m", []),
}
ALERT_OF = {"ghost": "RadixmeshGhostBlocks", "free_run": "RadixmeshLargestFreeRunLow", "oom": "RadixmeshOOMRate",
            "metadata": "RadixmeshMetadataServiceDown", "agent": "RadixmeshAgentMissing",
            "hit_rate": "RadixmeshHitRateDrop", "zone": "RadixmeshZoneWatermarkHigh", "router": "RadixmeshRouterDown",
            "scrape_agent": "RadixmeshAgentScrapeDown", "disk_corrupt": "RadixmeshDiskCorruptBlocks",
            "disk_write": "RadixmeshDiskWriteErrors", "disk_offers": "RadixmeshDiskOffersDropped"}


def alert_of(case: str) -> str:
    return next(a for prefix, a in ALERT_OF.items() if case.startswith(prefix))


@pytest.mark.parametrize("case", sorted(CASES))
def test_promtool_test_rules(promtool: str, case: str, tmp_path: Path) -> None:
    series, at, firing = CASES[case]
    alert = alert_of(case)
    promtool_test(promtool, tmp_path, series, [{
        "eval_time": at, "alertname": alert,
        "exp_alerts": [{"exp_labels": {**labels, "severity": severity(alert)}} for labels in firing]}])


@pytest.mark.anyio
@pytest.mark.integration
async def test_no_alert_fires_on_a_real_idle_clusters_scrape(promtool: str, tmp_path: Path) -> None:
    # issue 40: the shipped rules fired on a healthy idle cluster (the weights zone, always full by design;
    # the prefix zone once traffic had filled it). Here the rules run for an hour over what a real cluster
    # exports after traffic filled its pools, held still as an idle cluster's would be.
    async with local_cluster(2, publish=True, gpu_blocks=64) as c:
        runner, port = await start_http(c.router, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{port}"
                for i in range(24):  # 24 distinct ~100-token prompts: more than two 64-block pools hold
                    body = {"model": MODEL_NAME, "prompt": f"Prompt {i}: " + "words to cache " * 6, "max_tokens": 2}
                    async with http.post(f"{url}/v1/completions", json=body) as r:
                        assert r.status == 200
                async with http.get(f"{url}/metrics") as r:
                    text = await r.text()
        finally:
            await runner.cleanup()
    held = {_series(s): f"{s.value:f}+0x60" for f in text_string_to_metric_families(text) for s in f.samples
            if math.isfinite(s.value)}
    assert any(k.startswith("radixmesh_zone_watermark{") and 'zone="weights"' in k for k in held)
    assert any(k.startswith("radixmesh_pool_utilization{") for k in held)
    held['up{job="radixmesh",role="router",instance="r:8000"}'] = "1x60"
    held.update({f'up{{job="radixmesh",role="agent",node="{a.config.node_id}",instance="{a.config.node_id}:9000"}}':
                 "1x60" for a in c.agents})
    promtool_test(promtool, tmp_path, held, [{"eval_time": "60m", "alertname": alert, "exp_alerts": []}
                                             for alert in sorted(rules())])


def _series(sample: Sample) -> str:
    labels = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}}"


def promtool_test(promtool: str, tmp_path: Path, series: dict[str, str], alert_tests: list[dict[str, object]]) -> None:
    """`promtool test rules` on the shipped rules: `series` (1-minute samples from time 0) and the alerts
    expected at each evaluation time."""
    test = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": alert_tests,
        }],
    }
    # promtool compares annotations too, which would make each case restate the rule's summary text;
    # the rules under test are the file's own, annotations removed (check_rules lints the templates).
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rules_path = tmp_path / "alerts.yml"
    rules_path.write_text(yaml.safe_dump(doc))
    test["rule_files"] = [str(rules_path)]
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test))
    run = subprocess.run([promtool, "test", "rules", str(path)], check=False, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def severity(alert: str) -> str:
    doc = yaml.safe_load(ALERTS.read_text())
    [level] = [r["labels"]["severity"] for g in doc["groups"] for r in g["rules"] if r["alert"] == alert]
    return str(level)
