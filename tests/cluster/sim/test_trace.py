"""Mooncake trace reading and the hash id -> tokens -> block hash mapping."""

import itertools
import json
from pathlib import Path

import pytest

from radixmesh.cluster.sim.trace import TokenMapping, TraceRequest, read_trace

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


def _write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def _line(ts: float, inp: int, ids: list[int], out: int = 1) -> str:
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids})


def test_reads_fields_and_scales_arrivals(tmp_path: Path) -> None:
    p = _write(tmp_path, [_line(0, 600, [1, 2], 7), "", _line(1500, 512, [1])])
    got = read_trace(p, speedup=2.0)
    assert got == [TraceRequest(0.0, 600, 7, (1, 2)), TraceRequest(0.75, 512, 1, (1,))]


def test_limit_stops_after_k_requests(tmp_path: Path) -> None:
    p = _write(tmp_path, [_line(i, 10, [i]) for i in range(5)])
    assert [r.hash_ids for r in read_trace(p, limit=2)] == [(0,), (1,)]
    assert read_trace(p, limit=0) == []


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "not JSON"),
        (json.dumps({"timestamp": 0, "input_length": 5}), "needs the fields"),
        (_line(-1, 10, [1]), "timestamp"),
        (
            json.dumps({"timestamp": 0, "input_length": True, "output_length": 1, "hash_ids": [1]}),
            "input_length",
        ),
        (json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}), "hash_ids"),
        (_line(0, 1025, [1, 2]), "2 hash_ids"),
    ],
)
def test_malformed_line_names_the_line(tmp_path: Path, line: str, needle: str) -> None:
    p = _write(tmp_path, [_line(0, 10, [1]), line])
    with pytest.raises(ValueError, match=needle) as e:
        read_trace(p)
    assert ":2:" in str(e.value)


def test_decreasing_timestamp_is_refused(tmp_path: Path) -> None:
    p = _write(tmp_path, [_line(5, 10, [1]), _line(4, 10, [2])])
    with pytest.raises(ValueError, match="before the previous"):
        read_trace(p)


@pytest.mark.parametrize("speedup", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_speedup(tmp_path: Path, speedup: float) -> None:
    with pytest.raises(ValueError, match="speedup"):
        read_trace(_write(tmp_path, [_line(0, 10, [1])]), speedup=speedup)


def test_equal_ids_give_equal_tokens_and_different_ids_differ() -> None:
    m = TokenMapping(tokens_per_block=40, vocab_size=1000)
    a = m.block_tokens(7)
    assert a == TokenMapping(tokens_per_block=40, vocab_size=1000).block_tokens(7)
    assert len(a) == 40 and all(0 <= t < 1000 for t in a)
    assert a != m.block_tokens(8)
    assert TokenMapping(tokens_per_block=16).block_tokens(7) != TokenMapping(
        tokens_per_block=16
    ).block_tokens(-7)


def test_shared_prefix_ids_share_exactly_the_prefix_hashes() -> None:
    m = TokenMapping(tokens_per_block=4)
    r1 = TraceRequest(0.0, 1536, 1, (0, 1, 2))
    r2 = TraceRequest(0.0, 1536, 1, (0, 1, 3))
    h1, h2 = m.hashes(r1), m.hashes(r2)
    assert len(h1) == 3 and h1[:2] == h2[:2] and h1[2] != h2[2]
    assert m.tokens(r1)[:8] == m.tokens(r2)[:8]


def test_token_mapping_validates() -> None:
    with pytest.raises(ValueError, match="tokens_per_block"):
        TokenMapping(tokens_per_block=0)
    with pytest.raises(ValueError, match="vocab_size"):
        TokenMapping(vocab_size=1)


def test_reads_the_shared_mooncake_trace() -> None:
    reqs = read_trace(TRACES / "mooncake_trace_1000.jsonl", speedup=10.0)
    assert len(reqs) == 1000
    assert reqs[0].hash_ids[:3] == (0, 1, 2) and reqs[0].input_length == 6755
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(reqs))
