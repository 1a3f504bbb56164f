"""`radixmesh front` takes an engine's events as the JSON of vLLM's `--kv-events-config` (issue 30):
the spec's last field, mapped onto the ingest's SubscriberConfig (a bind-all host becomes the
engine URL's host), refused with a usage error naming the problem; end to end over a fake engine,
the reset endpoint included."""

import asyncio
import json
import os
import re
import signal
import sys
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from radixmesh.cluster.cli.front import parse_engine
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.fleet.ingest.external_engine import ExternalEngineConfig
from radixmesh.cluster.fleet.ingest.subscriber import SubscriberConfig
from tests.cluster.fleet.test_external_engine import BS, SYSTEM, fake_engine, wait_subscribed
from tests.support.poll import until

VLLM = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}
"""The config of vLLM's own KV-events example."""
ADMIN = "front-admin-key-0123456789"


def parse(spec: str) -> ExternalEngineConfig:
    return parse_engine(spec, model="m", block_size=16, layout="external:m:bs16", hash_key=b"k", capacity_blocks=0)


def with_config(config: object, url: str = "http://10.0.0.5:8000") -> str:
    return f"name=vllm-0,url={url},kv-events-config={json.dumps(config)}"


def test_a_bind_all_endpoint_is_reached_at_the_engine_urls_host() -> None:
    engine = parse(with_config(VLLM))
    assert engine.events == SubscriberConfig("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558", "kv-events")
    assert engine.node_id == "vllm-0" and engine.openai_url == "http://10.0.0.5:8000"


@pytest.mark.parametrize(("endpoint", "url", "expected"), [
    ("tcp://0.0.0.0:6000", "http://gpu-3.local:8000", "tcp://gpu-3.local:6000"),
    ("tcp://*:6000", "http://[fd00::5]:8000", "tcp://[fd00::5]:6000"),
    ("tcp://[::]:6000", "https://10.0.0.7", "tcp://10.0.0.7:6000"),
    ("tcp://10.1.1.1:6000", "http://10.0.0.5:8000", "tcp://10.1.1.1:6000"),  # a named host stays
    ("ipc:///tmp/kv-events", "http://127.0.0.1:8000", "ipc:///tmp/kv-events"),
])
def test_endpoints_map_to_connect_addresses(endpoint: str, url: str, expected: str) -> None:
    engine = parse(with_config({"enable_kv_cache_events": True, "endpoint": endpoint}, url))
    # vLLM's defaults: publisher zmq once events are enabled, no replay socket, every topic
    assert engine.events == SubscriberConfig(expected, None, "")


def test_the_engine_side_settings_are_accepted_and_do_not_matter_here() -> None:
    engine = parse(with_config({**VLLM, "buffer_steps": 100, "hwm": 10, "max_queue_size": 5, "publisher": "zmq"}))
    assert engine.events.endpoint == "tcp://10.0.0.5:5557"


@pytest.mark.parametrize(("spec", "error"), [
    ("name=a,url=http://h:1,kv-events-config={not json", "kv-events-config is not JSON"),
    (with_config([VLLM]), "must be a JSON object"),
    (with_config({"enable_kv_cache_events": True}), "lacks endpoint"),
    (with_config({**VLLM, "publisher": "null"}), "publisher 'null' publishes nothing"),
    (with_config({**VLLM, "enable_kv_cache_events": False}), "enable_kv_cache_events is not true"),
    (with_config({k: v for k, v in VLLM.items() if k != "enable_kv_cache_events"}), "enable_kv_cache_events is not"),
    (with_config({**VLLM, "endpont": "tcp://*:1"}), "unknown field(s) endpont"),
    (with_config({**VLLM, "endpoint": "inproc://kv"}), "must be tcp://host:port"),
    (with_config({**VLLM, "endpoint": "tcp://*"}), "must be tcp://host:port"),
    (with_config({**VLLM, "replay_endpoint": 5558}), "replay_endpoint must be"),
    (with_config({**VLLM, "topic": None}), "topic a string"),
    (with_config(VLLM, url="http://:8000"), "names no host"),
    ("name=a,url=http://h:1,events=tcp://h:2,kv-events-config=" + json.dumps(VLLM), "not both"),
    ("name=a,kv-events-config=" + json.dumps(VLLM), "lacks url"),
    ("name=a,url=http://h:1", "lacks events"),
])
def test_a_bad_kv_events_config_is_refused_by_name(spec: str, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        parse(spec)


def test_front_turns_a_bad_config_into_a_usage_error() -> None:
    spec = with_config({**VLLM, "publisher": "null"})
    result = CliRunner().invoke(main, ["front", "--model", "m", "--engine", spec])
    assert result.exit_code == 2 and "publisher 'null' publishes nothing to follow" in result.output


async def _indexed_blocks_are(http: aiohttp.ClientSession, base: str, n: int) -> bool:
    async with http.get(f"{base}/stats") as r:
        return int((await r.json())["metadata"]["indexed_blocks"]) == n


async def _cached(http: aiohttp.ClientSession, api: str, prompt: list[int]) -> int:
    body = {"model": "fake-model", "prompt": prompt, "max_tokens": 2}
    async with http.post(f"{api}/completions", json=body) as r:
        assert r.status == 200, await r.text()
        doc: dict[str, Any] = await r.json()
    return int(doc["usage"]["prompt_tokens_details"]["cached_tokens"])


@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.slow
async def test_front_follows_an_engine_by_its_kv_events_config_and_resets_it() -> None:
    async with fake_engine("--replay") as engine:
        pub, replay = engine.pub.rpartition(":")[2], (engine.replay or "").rpartition(":")[2]
        config = {**VLLM, "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}", "topic": ""}
        args = [sys.executable, "-m", "radixmesh.cluster.cli", "front", "--model", "fake-model", "--block-size",
                str(BS), "--port", "0", "--engine", f"name=a,url={engine.url},kv-events-config={json.dumps(config)}"]
        # The reset is an admin operation (issue 38): the front's key comes from its environment.
        env = {**os.environ, "RADIXMESH_ADMIN_KEY": ADMIN}
        process = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, env=env)
        assert process.stdout is not None
        try:
            async with asyncio.timeout(60):
                line = (await process.stdout.readline()).decode()
            assert line.startswith("radixmesh front: http://127.0.0.1:"), line
            api = line.split()[2]
            base = api[:-len("/v1")]
            async with aiohttp.ClientSession() as http:
                await wait_subscribed(http, engine)
                assert await _cached(http, api, [*SYSTEM, 1]) == 0
                await until(lambda: _indexed_blocks_are(http, base, 10), "the engine's 10 blocks reach the index",
                            timeout_s=15, pause_s=0.02)
                assert await _cached(http, api, [*SYSTEM, 2]) == 40

                async with http.post(f"{base}/reset_prefix_cache") as r:
                    assert r.status == 403 and (await r.json())["error"]["code"] == "admin_key_required"
                assert await _indexed_blocks_are(http, base, 10)  # the refused reset changed nothing
                async with http.post(f"{base}/reset_prefix_cache", headers={"Authorization": f"Bearer {ADMIN}"}) as r:
                    assert r.status == 200, await r.text()
                    assert await r.json() == {"status": "ok", "dropped_blocks": 0,
                                              "nodes": {"a": {"status": "reset", "dropped_blocks": {}}}}
                await until(lambda: _indexed_blocks_are(http, base, 0), "AllBlocksCleared empties the index",
                            timeout_s=15, pause_s=0.02)
                assert await _cached(http, api, [*SYSTEM, 3]) == 0
        finally:
            process.send_signal(signal.SIGINT)
            async with asyncio.timeout(30):
                assert await process.wait() == 0
