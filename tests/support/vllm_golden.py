"""The golden vLLM KV-event frames (tests/data/vllm_kv_events): captured from vLLM 0.11.0's publisher
and replay socket, and one batch in vLLM main's map encoding. Read once for every test that checks
against them."""

import json
from pathlib import Path

DATA = Path(__file__).parents[1] / "data" / "vllm_kv_events"
GOLDEN = json.loads((DATA / "v0.11.0_frames.json").read_text())
PUB = [[bytes.fromhex(f) for f in frames] for frames in GOLDEN["pub"]]
REPLAY = [[bytes.fromhex(f) for f in frames] for frames in GOLDEN["replay"]]
MAIN_PAYLOAD = bytes.fromhex(json.loads((DATA / "main_map_batch.json").read_text())["payload"])
