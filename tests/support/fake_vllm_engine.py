"""A stand-in for a vLLM server, run as its own process by tests/cluster/fleet/test_external_engine.py.

    python tests/support/fake_vllm_engine.py --block-size 4 --num-blocks 64 [--replay] [--encoding map|array] \
        [--reset vllm|sglang|none]

It prints one JSON line, {"http_port", "pub_port", "replay_port"}, once it serves. What it serves:
- `POST /v1/completions` (prompt as token ids, streaming or not, `cache_salt`, `seed`,
  `return_token_ids`): a prefix cache of `--num-blocks` blocks keyed by its own chained sha256 hashes
  over (parent, tokens, extra keys) the way vLLM keys them (cache_salt in the first block's extra
  keys); `usage.prompt_tokens_details.cached_tokens` counts the cached prefix (never the last prompt
  token, as vLLM recomputes it); output token i is (seed + i + last prompt token) % 256.
- KV events on a ZMQ PUB socket, frames (topic, 8-byte big-endian seq, msgpack KVEventBatch) built
  by hand to vLLM's schema (vllm/distributed/kv_events.py): `map` as vLLM main encodes them (with
  extra_keys), `array` as v0.11 does (array_like, no extra_keys); with `--replay`, a ROUTER socket
  answering replay requests as ZmqEventPublisher._service_replay does. The PUB socket is an XPUB so
  the test can see that a subscriber arrived (`GET /control/subscribers`) instead of sleeping.
- `GET /metrics`: vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc,
  vllm:cache_config_info; the cache reset of `--reset`: `vllm` (the default) serves vLLM's
  `POST /reset_prefix_cache`, `sglang` SGLang's `POST /flush_cache` (refused with HTTP 400 while the
  waiting gauge is above 0, as SGLang refuses while requests wait or run), `none` neither (vLLM
  without VLLM_SERVER_DEV_MODE); a reset empties the cache and publishes AllBlocksCleared;
  `POST /control/lose_next_batch` (the next batch gets its seq but never reaches the PUB socket);
  `POST /control/waiting` {"n"} sets the waiting gauge.
"""

import argparse
import asyncio
import hashlib
import json
import sys
import time
from collections import OrderedDict
from typing import Any

import msgpack
import zmq
import zmq.asyncio
from aiohttp import web


class FakeEngine:
    def __init__(self, block_size: int, num_blocks: int, encoding: str, replay: bool) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.encoding = encoding
        self.cache: OrderedDict[bytes, None] = OrderedDict()
        """Cached block hashes, least recently used first."""
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = self.ctx.socket(zmq.ROUTER) if replay else None
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1") if self.router else None
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.lose_next = False
        self.subscribers = 0
        self.waiting = 0

    # --- the prefix cache ----------------------------------------------------------------------
    def hashes(self, prompt: list[int], salt: str | None) -> list[tuple[bytes, list[int], tuple[Any, ...] | None]]:
        out = []
        parent = b"none"
        for i in range(len(prompt) // self.block_size):
            tokens = prompt[i * self.block_size : (i + 1) * self.block_size]
            extra = (salt,) if i == 0 and salt else None
            digest = hashlib.sha256(parent + json.dumps([tokens, extra]).encode()).digest()
            out.append((digest, tokens, extra))
            parent = digest
        return out

    def admit(self, prompt: list[int], salt: str | None) -> int:
        """Cache the prompt's full blocks; the cached prefix tokens it found."""
        blocks = self.hashes(prompt, salt)
        usable = (len(prompt) - 1) // self.block_size
        hit = 0
        while hit < min(len(blocks), usable) and blocks[hit][0] in self.cache:
            hit += 1
        for h, _, _ in blocks[:hit]:
            self.cache.move_to_end(h)
        new = [b for b in blocks if b[0] not in self.cache]
        mine = {h for h, _, _ in blocks}
        evict = []
        while len(self.cache) + len(new) > self.num_blocks:
            victim = next((h for h in self.cache if h not in mine), None)
            if victim is None:
                break
            del self.cache[victim]
            evict.append(victim)
        events: list[Any] = []
        if evict:
            events.append(self.removed(evict))
        if new:
            first = blocks.index(new[0])
            parent = blocks[first - 1][0] if first > 0 else None
            for h, _, _ in new:
                self.cache[h] = None
            events.append(self.stored(new, parent))
        if events:
            self.publish(events)
        return hit * self.block_size

    # --- vLLM's event schema -------------------------------------------------------------------
    def stored(self, blocks: list[tuple[bytes, list[int], tuple[Any, ...] | None]], parent: bytes | None) -> Any:
        hashes = [h for h, _, _ in blocks]
        tokens = [t for _, ts, _ in blocks for t in ts]
        if self.encoding == "array":
            return ["BlockStored", hashes, parent, tokens, self.block_size, None, "GPU"]
        extra = [list(e) if e else None for _, _, e in blocks]
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                "block_size": self.block_size, "lora_id": None, "medium": "GPU", "lora_name": None,
                "extra_keys": extra if any(extra) else None}

    def removed(self, hashes: list[bytes]) -> Any:
        if self.encoding == "array":
            return ["BlockRemoved", hashes, "GPU"]
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}

    def cleared(self) -> Any:
        return ["AllBlocksCleared"] if self.encoding == "array" else {"type": "AllBlocksCleared"}

    def publish(self, events: list[Any]) -> None:
        batch: Any = [time.time(), events, 0] if self.encoding == "array" else {
            "ts": time.time(), "events": events, "data_parallel_rank": 0}
        payload = msgpack.packb(batch, use_bin_type=True)
        seq, self.seq = self.seq, self.seq + 1
        self.buffer.append((seq, payload))
        if self.lose_next:
            self.lose_next = False
            return
        self.pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))

    async def watch_subscriptions(self) -> None:
        while True:
            message = await self.pub.recv()
            if message[:1] == b"\x01":
                self.subscribers += 1

    async def serve_replay(self) -> None:
        assert self.router is not None
        while True:
            client, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= first:
                    await self.router.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            await self.router.send_multipart((client, b"", (-1).to_bytes(8, "big", signed=True), b""))

    # --- HTTP ----------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt) or not prompt:
            return web.json_response({"error": {"message": "prompt must be token ids", "code": 400}}, status=400)
        max_tokens = int(body.get("max_tokens", 16))
        cached = self.admit(prompt, body.get("cache_salt"))
        seed = int(body.get("seed") or 0)
        output = [(seed + i + prompt[-1]) % 256 for i in range(max_tokens)]
        usage = {"prompt_tokens": len(prompt), "completion_tokens": max_tokens,
                 "total_tokens": len(prompt) + max_tokens, "prompt_tokens_details": {"cached_tokens": cached}}
        if not body.get("stream"):
            choice = {"index": 0, "text": "", "token_ids": output, "finish_reason": "length"}
            return web.json_response({"id": "cmpl-fake", "object": "text_completion", "choices": [choice],
                                      "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, token in enumerate(output):
            finish = "length" if i == len(output) - 1 else None
            chunk = {"id": "cmpl-fake", "object": "text_completion",
                     "choices": [{"index": 0, "text": chr(token), "token_ids": [token], "finish_reason": finish}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage_chunk = {"id": "cmpl-fake", "object": "text_completion", "choices": [], "usage": usage}
        await response.write(f"data: {json.dumps(usage_chunk)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        label = 'engine="0",model_name="fake"'
        text = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{label}}} {float(self.waiting)}\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{label}}} 0.0\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{label}}} {len(self.cache) / self.num_blocks}\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{self.block_size}",num_gpu_blocks="{self.num_blocks}"}} 1.0\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.cache.clear()
        self.publish([self.cleared()])
        return web.Response(status=200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        # SGLang's reply, word for word, whether it flushed (200) or refused (400)
        text = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
                "requests, the operation will not be performed.)\n")
        if self.waiting:
            return web.Response(text=text, status=400)
        self.cache.clear()
        self.publish([self.cleared()])
        return web.Response(text=text)

    async def lose_next_batch(self, request: web.Request) -> web.Response:
        self.lose_next = True
        return web.Response(text="ok")

    async def set_waiting(self, request: web.Request) -> web.Response:
        self.waiting = int((await request.json())["n"])
        return web.Response(text="ok")

    async def subscriber_count(self, request: web.Request) -> web.Response:
        return web.json_response({"subscribers": self.subscribers})


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--num-blocks", type=int, default=64)
    parser.add_argument("--encoding", choices=["map", "array"], default="map")
    parser.add_argument("--replay", action="store_true")
    parser.add_argument("--reset", choices=["vllm", "sglang", "none"], default="vllm")
    args = parser.parse_args()
    engine = FakeEngine(args.block_size, args.num_blocks, args.encoding, args.replay)
    app = web.Application()
    app.router.add_post("/v1/completions", engine.completions)
    app.router.add_get("/metrics", engine.metrics)
    if args.reset == "vllm":
        app.router.add_post("/reset_prefix_cache", engine.reset_prefix_cache)
    elif args.reset == "sglang":
        app.router.add_post("/flush_cache", engine.flush_cache)
    app.router.add_post("/control/lose_next_batch", engine.lose_next_batch)
    app.router.add_post("/control/waiting", engine.set_waiting)
    app.router.add_get("/control/subscribers", engine.subscriber_count)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    tasks = [asyncio.create_task(engine.watch_subscriptions())]
    if engine.router is not None:
        tasks.append(asyncio.create_task(engine.serve_replay()))
    print(json.dumps({"http_port": port, "pub_port": engine.pub_port, "replay_port": engine.replay_port}), flush=True)
    # Serve until the test closes our stdin (or kills us).
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for t in tasks:
        t.cancel()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
