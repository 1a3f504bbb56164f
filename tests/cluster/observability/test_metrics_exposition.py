"""The router's /metrics, scraped over HTTP from a running router (real agents, real metadata service,
one UCX pull between agents), is valid Prometheus text: `promtool check metrics` finds no problem
but the colon of the vLLM names the agents export for GAIE's endpoint pickers, and radixmesh's own
conventions hold. Plus the merge of expositions on input that would break them."""

import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.observability.endpoints import merge_expositions
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import PullPlan, ServePlan, ServeResult
from radixmesh.proto.serve.sampling import SamplingParams
from tests.node_agent.test_gaie_metrics import COLON_LINTS, GAIE
from tests.support.router_cluster import MODEL_NAME, local_cluster

# Distributions observed since start; anything else typed histogram is a mistake (a point-in-time
# distribution is a labelled gauge: radixmesh_free_runs{size_le}).
HISTOGRAMS = {"radixmesh_transfer_seconds", "radixmesh_router_ttft_seconds", "radixmesh_time_to_first_token_seconds",
              "radixmesh_router_inter_token_latency_seconds", "radixmesh_router_e2e_request_latency_seconds",
              "radixmesh_router_queue_seconds", "radixmesh_inter_token_latency_seconds",
              "radixmesh_request_queue_time_seconds", "radixmesh_handoff_seconds",
              "radixmesh_handoff_overlap_seconds"}
BYTES_HELP = re.compile(r"\bbytes\b", re.IGNORECASE)
SECONDS_HELP = re.compile(r"\b(seconds?|times?|latency|duration)\b", re.IGNORECASE)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so the one cluster and its scrape serve every test here."""
    return "asyncio"


async def _serve_directly(agent_serve: AsyncIterator[object]) -> ServeResult:
    items = [item async for item in agent_serve]
    assert isinstance(items[-1], ServeResult)
    return items[-1]


@pytest.fixture(scope="module")
async def scrape() -> str:
    """GET /metrics after requests through the router and one pull from agent a to agent b."""
    async with local_cluster(2, publish=True, transfer="ucx") as c:
        runner, port = await start_http(c.router, "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{port}"
                shared = "A shared prefix long enough to span several blocks, asked more than once."
                for prompt in (shared, shared, shared + " Then more.", "Something else entirely."):
                    async with http.post(f"{url}/v1/completions",
                                         json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2}) as r:
                        assert r.status == 200
                # The router sends the prompt where its prefix is: pull one on purpose, so the per-peer
                # pull families (labels node, peer, outcome) hold samples.
                a, b = c.agents
                tokens = tuple(range(1, 31))
                sampling = SamplingParams(max_tokens=2, ignore_eos=True)
                await _serve_directly(a.serve(ServePlan("own", tokens, sampling)))
                pull = PullPlan(a.node, a.transfer_address, 0, 7)
                pulled = await _serve_directly(b.serve(ServePlan("pulled", tokens, sampling, pull=pull)))
                assert pulled.stats.tokens.remote == 28 and not pulled.stats.pull_failed
                async with http.get(f"{url}/metrics") as r:
                    assert r.status == 200
                    return await r.text()
        finally:
            await runner.cleanup()


@pytest.fixture(scope="module")
def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but promtool is not on PATH: .ci/run installs it (Debian's prometheus package)")
        pytest.skip("promtool is not on PATH (it comes with Debian's `prometheus` package; CI installs it)")
    return exe


pytestmark = [pytest.mark.anyio, pytest.mark.integration]


async def test_promtool_finds_no_problem_in_a_live_scrape(promtool: str, scrape: str, tmp_path: Path) -> None:
    path = tmp_path / "metrics.prom"
    path.write_text(scrape)
    with path.open() as f, anyio.fail_after(60):  # `promtool check metrics` reads the text on stdin
        run = await anyio.run_process([promtool, "check", "metrics"], stdin=f, check=False)
    # Only the colon of the vLLM names GAIE's endpoint pickers read (tests/node_agent/test_gaie_metrics.py).
    assert set((run.stdout + run.stderr).decode().splitlines()) == COLON_LINTS


async def test_a_live_scrape_follows_our_conventions(scrape: str) -> None:
    families = list(text_string_to_metric_families(scrape))
    assert {"a", "b"} <= {s.labels.get("node") for f in families for s in f.samples}
    assert any(s.labels.get("peer") == "a" for f in families if f.name == "radixmesh_pulls" for s in f.samples)
    for f in families:
        assert f.name.startswith("radixmesh_") or f.name in GAIE, f.name
        # vLLM's habit: every family carries the served model, so one Prometheus can hold several.
        assert {s.labels.get("model_name") for s in f.samples} <= {MODEL_NAME}, f.name
        assert all("model_name" in s.labels for s in f.samples), f"{f.name} lacks model_name"
        if BYTES_HELP.search(f.documentation):
            assert f.name.endswith("_bytes"), f"{f.name} carries bytes ({f.documentation!r})"
        if SECONDS_HELP.search(f.documentation):
            assert f.name.endswith("_seconds"), f"{f.name} carries seconds ({f.documentation!r})"
    # The parser strips a counter's _total; the text must carry it (and only counters may).
    typed = [line.split()[2:4] for line in scrape.splitlines() if line.startswith("# TYPE ")]
    assert len(typed) == len({name for name, _ in typed}), "a family is declared twice"
    for name, kind in typed:
        assert name.endswith("_total") == (kind == "counter"), f"{kind} {name}"
    assert {f.name for f in families if f.type == "histogram"} == HISTOGRAMS
    series = [(s.name, frozenset(s.labels.items())) for f in families for s in f.samples]
    assert len(series) == len(set(series)), "duplicate series"


def test_merge_writes_each_family_once_and_drops_repeated_series() -> None:
    own = ("# HELP radixmesh_pulls_total Pulls.\n# TYPE radixmesh_pulls_total counter\n"
           'radixmesh_pulls_total{node="a",peer="b"} 1.0\n')
    agent = ("# HELP radixmesh_pulls_total Pulls.\n# TYPE radixmesh_pulls_total counter\n"
             'radixmesh_pulls_total{peer="b"} 5.0\nradixmesh_pulls_total{peer="c"} 2.0\n'
             "# HELP radixmesh_pulls Pulls, as a gauge.\n# TYPE radixmesh_pulls gauge\nradixmesh_pulls 3.0\n")
    merged = merge_expositions(own, {NodeId("a"): agent})
    assert merged.count("# TYPE radixmesh_pulls_total counter") == 1 and "gauge" not in merged
    [family] = text_string_to_metric_families(merged)
    values = {tuple(sorted(s.labels.items())): s.value for s in family.samples}
    # node a's {peer="b"} becomes the router's own series: the first one written wins
    assert values == {(("node", "a"), ("peer", "b")): 1.0, (("node", "a"), ("peer", "c")): 2.0}
