"""`up --local 2 --prefill 1 --decode 1` for real (issue 37): launcher.up on a local Ray, the agents'
roles reach the router through their registration (the reconciler's directory), every completion
is prefilled on node-0 and decoded on node-1 from the KV it pulled over UCX, with the tokens of one
cache-less engine; the router's /metrics and /stats count the hand-offs; with a prefill actor killed,
requests are retried on the other one; with a prefill actor killed mid-hand-off (after its prefill,
before the decode agent's pull; or while it serves that pull), the decode agent recomputes what it
could not pull and the tokens are the same; with a decode actor killed while it streams, its requests
end on the other decode agent with the same tokens, and with none left a stream ends with a clean
error. No block leaks on either side."""

import asyncio
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import aiohttp
import openai
import psutil
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.launch import launcher
from radixmesh.cluster.launch.config import LauncherConfig
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.local_deployment import deployed, module_ray
from tests.support.poll import until
from tests.support.ray_faults import Gate, hold_next_pull, stall_pulls_served
from tests.support.router_cluster import SOURCE, reference

pytestmark = [pytest.mark.ray, pytest.mark.anyio, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
TOK = ByteTokenizer()
BS = 4
CONFIG = LauncherConfig(local_nodes=3, prefill_nodes=1, decode_nodes=2, model=SOURCE, block_size=BS,
                        gpu_blocks=256, heartbeat_interval_s=0.2, publish_interval_s=0.01, model_name="tiny-test",
                        log_level="ERROR")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    yield from module_ray(CONFIG)


async def router_stats(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/stats") as r:
        return dict((await r.json())["router"])


async def no_leak(handles: dict[NodeId, Any], idle: dict[NodeId, int], nodes: list[NodeId]) -> None:
    """Once idle, every block of `nodes` is free or cached again (`idle`: their free blocks before the
    requests), and their invariants hold."""
    async def idle_again() -> bool:
        loads = [await handles[n].load.remote() for n in nodes]
        return [x.free_blocks for x in loads] == [idle[n] for n in nodes] and not any(
            x.queued_requests or x.running_tokens for x in loads)

    await until(idle_again, f"{nodes} idle with every block free or cached", pause_s=0.05)
    for n in nodes:
        await handles[n].check_invariants.remote()


def exited(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def killed(handle: Any) -> None:
    """Kill an agent actor for good and return once it is gone: a call to it fails and its process has
    exited. (Ray fails calls as soon as it marks the actor dead; on a loaded box the process served a
    pull for a few more milliseconds after that, and a hand-off meant to fail was pulled.)"""
    pid = await handle.__ray_call__.remote(lambda actor: os.getpid())
    ray.kill(handle, no_restart=True)

    async def gone() -> bool:
        try:
            await handle.load.remote()
        except ray.exceptions.RayActorError:
            return exited(pid)
        return False

    await until(gone, "the killed actor gone", pause_s=0.05)


async def test_a_1p1d_deployment_hands_every_prompt_to_its_decode_agent(local_ray: None) -> None:
    async with deployed(replace(CONFIG, local_nodes=2, decode_nodes=1)) as d:
        assert [info.role for info in await launcher.router_handle().joined.remote()] in (
            ["prefill", "decode"], ["decode", "prefill"])
        sampling = SamplingParams(max_tokens=6)
        # Nothing shared between them: each is handed off (a turn the decode agent holds would be served
        # there whole).
        prompts = [f"{u}: user {u} of a split cluster asks what a hand-off is." for u in range(3)]
        async with openai.AsyncOpenAI(base_url=f"{d.router_url}/v1", api_key="unused", max_retries=0) as client:
            for text in prompts:
                out = await client.completions.create(model="tiny-test", prompt=text, max_tokens=6, temperature=0)
                assert out.choices[0].text == TOK.decode(list(reference(TOK.encode(text), sampling)))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{d.router_url}/metrics", params={"scope": "router"}) as r:
                families = {f.name: f for f in text_string_to_metric_families(await r.text())}
            async with http.get(f"{d.router_url}/stats") as r:
                stats = (await r.json())["router"]
        handoffs = {s.labels["outcome"]: s.value for s in families["radixmesh_handoffs"].samples
                    if s.name.endswith("_total")}
        assert handoffs == {"pulled": len(prompts)}
        roles = {s.labels["role"]: s.value for s in families["radixmesh_role_decisions"].samples
                 if s.name.endswith("_total")}
        assert roles == {"prefill": len(prompts), "decode": len(prompts)}
        assert stats["handoffs"] == {"pulled": len(prompts)} and stats["handoff_bytes"] > 0
        assert stats["nodes"]["node-1"]["routed"] == len(prompts) and stats["nodes"]["node-0"]["routed"] == len(prompts)
        for node in d.nodes:
            await launcher.agent_handle(node).check_invariants.remote()


async def test_a_killed_prefill_agent_is_replaced_by_the_other_with_the_same_tokens(local_ray: None) -> None:
    config = replace(CONFIG, prefill_nodes=2, decode_nodes=1, policy="round_robin")
    async with deployed(config) as d:
        ray.kill(launcher.agent_handle(NodeId("node-0")), no_restart=True)
        sampling = SamplingParams(max_tokens=6)
        async with openai.AsyncOpenAI(base_url=f"{d.router_url}/v1", api_key="unused", max_retries=0) as client:
            for u in range(3):
                # Nothing shared between them: each goes through a prefill agent.
                text = f"{u}: a prefill agent died; user {u} asks who prefilled this."
                out = await client.completions.create(model="tiny-test", prompt=text, max_tokens=6, temperature=0)
                assert out.choices[0].text == TOK.decode(list(reference(TOK.encode(text), sampling)))
        async with aiohttp.ClientSession() as http, http.get(f"{d.router_url}/stats") as r:
            stats = (await r.json())["router"]
        assert stats["requests_by_status"] == {"ok": 3} and stats["handoffs"] == {"pulled": 3}
        assert stats["nodes"]["node-0"]["failed_attempts"] >= 1 and stats["nodes"]["node-1"]["requests"] == 3
        for node in ("node-1", "node-2"):
            await launcher.agent_handle(NodeId(node)).check_invariants.remote()


async def test_a_prefill_agent_killed_mid_hand_off_costs_a_recompute_not_wrong_tokens_and_leaks_nothing(
        local_ray: None) -> None:
    # 2P1D: node-0 and node-1 prefill, node-2 decodes. Request A: the prefill agent that served it dies
    # after its prefill, before node-2's pull starts (node-2's pull held at a gate, opened once the
    # agent is gone). Request B: the other prefill agent dies while it serves node-2's pull (its
    # blocks pinned, nothing sent). Both times node-2 recomputes what it could not pull.
    # The hand-off after the prefill (not streamed): A's pull is held until its prefill agent is dead,
    # and B's pull must find its blocks computed. The streamed hand-off's mid-stream death:
    # tests/node_agent/test_handoff_stream.py, tests/cluster/router/test_disaggregation.py.
    config = replace(CONFIG, prefill_nodes=2, decode_nodes=1, stream_handoff=False)
    sampling = SamplingParams(max_tokens=6)
    # No shared first block: B's hand-off is a pull of its whole prompt, not of a tail past A's prefix.
    texts = ["System: the prefill agent dies before the pull. User asks: who computed this prompt?",
             "Question from a user whose prefill agent dies while it serves the pull: is the answer right?"]
    decode = NodeId("node-2")
    async with deployed(config) as d:
        handles = {n: launcher.agent_handle(n) for n in d.nodes}
        idle = {decode: (await handles[decode].load.remote()).free_blocks}
        async with openai.AsyncOpenAI(base_url=f"{d.router_url}/v1", api_key="unused", max_retries=0) as client:
            async def complete(text: str) -> str:
                out = await client.completions.create(model="tiny-test", prompt=text, max_tokens=6, temperature=0)
                return out.choices[0].text

            gate = Gate.remote()  # type: ignore[attr-defined]
            await handles[decode].__ray_call__.remote(hold_next_pull, gate)
            a = asyncio.create_task(complete(texts[0]))
            prefilled = NodeId(await gate.arrival.remote())  # node-2 is about to pull A from this agent
            await killed(handles[prefilled])
            await gate.open.remote()
            assert await a == TOK.decode(list(reference(TOK.encode(texts[0]), sampling)))

            survivor = NodeId("node-1" if prefilled == "node-0" else "node-0")
            gate = Gate.remote()  # type: ignore[attr-defined]
            await handles[survivor].__ray_call__.remote(stall_pulls_served, gate)
            b = asyncio.create_task(complete(texts[1]))
            assert int(await gate.arrival.remote()) > 0  # the survivor pinned B's blocks for node-2's pull
            await killed(handles[survivor])
            assert await b == TOK.decode(list(reference(TOK.encode(texts[1]), sampling)))
        stats = await router_stats(d.router_url)
        # Neither pull moved a block: each hand-off was recomputed on node-2, no request failed.
        assert stats["requests_by_status"] == {"ok": 2} and stats["handoffs"] == {"recomputed": 2}
        assert stats["nodes"][decode]["routed"] == 2
        await no_leak(handles, idle, [decode])


async def test_a_killed_decode_agent_loses_nothing_but_its_running_requests_and_no_block_leaks(
        local_ray: None) -> None:
    # 1P2D: node-0 prefills, node-1 and node-2 decode. The streams are long enough (tiny model on CPU:
    # seconds) to be running when their decode agent dies.
    long = 400
    sampling = SamplingParams(max_tokens=long, ignore_eos=True)
    async with deployed(CONFIG) as d:
        handles = {n: launcher.agent_handle(n) for n in d.nodes}
        idle = {n: (await h.load.remote()).free_blocks for n, h in handles.items()}

        async def stats() -> dict[str, Any]:
            return await router_stats(d.router_url)

        async with openai.AsyncOpenAI(base_url=f"{d.router_url}/v1", api_key="unused", max_retries=0) as client:
            async def stream(text: str, started: asyncio.Event) -> str:
                out = await client.completions.create(model="tiny-test", prompt=text, max_tokens=long, temperature=0,
                                                      stream=True, extra_body={"ignore_eos": True})
                parts: list[str] = []
                async for chunk in out:
                    started.set()
                    parts.append(chunk.choices[0].text if chunk.choices else "")
                return "".join(parts)

            # Four streams, two on each decode agent (the fewest in flight); one agent dies under them.
            texts = [f"System: a decode agent dies. User {u} asks: who decodes this?" for u in range(4)]
            started = [asyncio.Event() for _ in texts]
            tasks = [asyncio.create_task(stream(t, e)) for t, e in zip(texts, started, strict=True)]
            await asyncio.gather(*(e.wait() for e in started))
            inflight = (await stats())["nodes"]
            victim = max((NodeId("node-1"), NodeId("node-2")), key=lambda n: inflight[n]["inflight"])
            survivor = NodeId("node-2" if victim == "node-1" else "node-1")
            assert inflight[victim]["inflight"] >= 1
            ray.kill(handles[victim], no_restart=True)
            # Its requests end on the survivor with the tokens already sent not repeated: none is wrong.
            assert await asyncio.gather(*tasks) == [TOK.decode(list(reference(TOK.encode(t), sampling)))
                                                    for t in texts]
            after = await stats()
            assert after["nodes"][victim]["failed_attempts"] >= 1 and after["requests_by_status"] == {"ok": 4}
            text = "System: a decode agent died. User 9 asks: who decodes now?"
            out = await client.completions.create(model="tiny-test", prompt=text, max_tokens=8, temperature=0)
            assert out.choices[0].text == TOK.decode(list(reference(TOK.encode(text), SamplingParams(max_tokens=8))))
            assert (await stats())["nodes"][survivor]["routed"] == after["nodes"][survivor]["routed"] + 1
            await no_leak(handles, idle, [NodeId("node-0"), survivor])

            # The last decode agent dies under a stream: nothing is left to finish it, so it ends with an
            # error (503), after tokens of the right answer only.
            ref = TOK.decode(list(reference(TOK.encode(texts[0]), sampling)))
            started_last = asyncio.Event()
            pieces: list[str] = []

            async def last() -> None:
                out = await client.completions.create(model="tiny-test", prompt=texts[0], max_tokens=long,
                                                      temperature=0, stream=True, extra_body={"ignore_eos": True})
                async for chunk in out:
                    started_last.set()
                    pieces.append(chunk.choices[0].text if chunk.choices else "")

            task = asyncio.create_task(last())
            await started_last.wait()
            ray.kill(handles[survivor], no_restart=True)
            with pytest.raises(openai.APIError, match="no decode agent left"):
                await task
            assert ref.startswith("".join(pieces)) and len("".join(pieces)) < len(ref)
            await no_leak(handles, idle, [NodeId("node-0")])
