"""Writes the golden KV-event frames that tests/proto/test_vllm_kv_events.py decodes.

    python tests/data/vllm_kv_events/generate.py /path/to/vllm-0.11.0-*.whl

`v0.11.0_frames.json`: frames captured from vLLM 0.11.0's own `ZmqEventPublisher` (its publisher
thread, its msgspec encoder, its replay ROUTER socket) over real ZMQ sockets on 127.0.0.1. The
module `vllm/distributed/kv_events.py` is loaded from the wheel by path; only its three imports of
vLLM internals that need torch (a logger, a config class used for type hints, the
`ExternalBlockHash = bytes | int` alias) are replaced by stand-ins, nothing it encodes with.

`main_map_batch.json`: vLLM's main branch (commit 0181ea3) dropped `array_like`, so its batches are
msgpack maps with the event tag under "type". No wheel of it is here: the payload is encoded by
msgspec (the encoder vLLM uses) from structs declared below to main's field list. Needs pyzmq and
msgspec.
"""

import importlib.util
import json
import logging
import sys
import tempfile
import time
import types
import zipfile
from pathlib import Path

import msgspec
import zmq

HERE = Path(__file__).resolve().parent


def load_vllm_kv_events(wheel: Path) -> types.ModuleType:
    tmp = Path(tempfile.mkdtemp())
    with zipfile.ZipFile(wheel) as z:
        z.extract("vllm/distributed/kv_events.py", tmp)
    for name in ("vllm", "vllm.config", "vllm.config.kv_events", "vllm.logger", "vllm.v1", "vllm.v1.core",
                 "vllm.v1.core.kv_cache_utils"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["vllm.config.kv_events"].KVEventsConfig = object  # type: ignore[attr-defined]
    sys.modules["vllm.logger"].init_logger = logging.getLogger  # type: ignore[attr-defined]
    sys.modules["vllm.v1.core.kv_cache_utils"].ExternalBlockHash = bytes | int  # type: ignore[attr-defined]
    spec = importlib.util.spec_from_file_location("vllm_kv_events", tmp / "vllm/distributed/kv_events.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def h(i: int) -> bytes:
    """A 32-byte engine hash (vLLM's sha256 digests are 32 bytes)."""
    return bytes([i]) * 32


def v0_11_frames(wheel: Path) -> dict[str, list[list[str]]]:
    kv = load_vllm_kv_events(wheel)
    ctx = zmq.Context.instance()
    # ipc:// makes vLLM's publisher bind (its heuristic binds "*", ipc and inproc addresses) without
    # opening a port on every interface; the frames are the same bytes over tcp.
    sockets = Path(tempfile.mkdtemp())
    pub_address, replay_address = f"ipc://{sockets}/pub", f"ipc://{sockets}/replay"
    publisher = kv.ZmqEventPublisher(0, endpoint=pub_address, replay_endpoint=replay_address, topic="kv-events")
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub_address)
    time.sleep(0.5)  # a PUB drops what it sends before the SUB's subscription arrives (generation only)
    batches = [
        [kv.BlockStored(block_hashes=[h(1), h(2)], parent_block_hash=None, token_ids=list(range(8)), block_size=4,
                        lora_id=None, medium="GPU")],
        [kv.BlockStored(block_hashes=[h(3)], parent_block_hash=h(2), token_ids=[8, 9, 10, 11], block_size=4,
                        lora_id=None, medium="GPU"),
         kv.BlockStored(block_hashes=[h(4)], parent_block_hash=None, token_ids=[100, 101, 102, 103],
                        block_size=4, lora_id=None, medium="CPU")],
        [kv.BlockRemoved(block_hashes=[h(3)], medium="GPU")],
        [kv.AllBlocksCleared()],
        [kv.BlockStored(block_hashes=[12345678901234], parent_block_hash=None, token_ids=[0, 1, 2, 3],
                        block_size=4, lora_id=7, medium=None)],
    ]
    for i, events in enumerate(batches):
        publisher.publish(kv.KVEventBatch(ts=1700000000.0 + i, events=events))
    pub_frames = [sub.recv_multipart() for _ in batches]
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_address)
    dealer.send_multipart((b"", (1).to_bytes(8, "big")))
    replay_frames = []
    while True:
        frames = dealer.recv_multipart()
        replay_frames.append(frames)
        if frames[1] == (-1).to_bytes(8, "big", signed=True):
            break
    publisher.shutdown()
    return {"pub": [[f.hex() for f in fr] for fr in pub_frames],
            "replay": [[f.hex() for f in fr] for fr in replay_frames]}


class MainEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(MainEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple | None] | None = None  # type: ignore[type-arg]
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(MainEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(MainEvent):
    pass


class KVEventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def main_map_batch() -> dict[str, str]:
    batch = KVEventBatch(ts=1700000100.5, data_parallel_rank=0, events=[
        BlockStored(block_hashes=[h(11), h(12)], parent_block_hash=None, token_ids=list(range(8)), block_size=4,
                    lora_id=None, medium="GPU", lora_name=None, extra_keys=[("tenant-a",), None],
                    group_idx=0, kv_cache_spec_kind="full_attention"),
        BlockStored(block_hashes=[h(13)], parent_block_hash=None, token_ids=[5, 6, 7, 8], block_size=4,
                    lora_id=None, medium="GPU", lora_name=None, extra_keys=[(("img-1", 0),)]),
        BlockRemoved(block_hashes=[h(12)], medium="GPU", group_idx=0),
        AllBlocksCleared(),
    ])
    return {"payload": msgspec.msgpack.encode(batch).hex()}


def main() -> None:
    wheel = Path(sys.argv[1])
    (HERE / "v0.11.0_frames.json").write_text(json.dumps(v0_11_frames(wheel), indent=1) + "\n")
    (HERE / "main_map_batch.json").write_text(json.dumps(main_map_batch(), indent=1) + "\n")


if __name__ == "__main__":
    main()
