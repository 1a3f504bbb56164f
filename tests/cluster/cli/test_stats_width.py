"""`radixmesh stats` in 80 columns, or piped (rich assumes 80 then): every header and value whole
(issue 40: eleven bordered columns cut each to `pro…`); narrower, cells fold, never lose characters."""

import io

import pytest
from rich.console import Console

from radixmesh.cluster.cli.route_stats import count, render_stats


def stats_doc() -> dict[str, object]:
    """A busy cluster's /stats: counts in the millions, node names as a GPU cluster names them."""
    node = {"inflight": 3, "routed": 123456, "failed_attempts": 0, "requests": 123456, "hit_rate": 0.873,
            "local_gpu": 12_345_678, "local_host": 0, "local_disk": 0, "remote": 1_234_567, "computed": 1_234_567}
    by = {"local_gpu": 0.51, "local_host": 0.02, "local_disk": 0.0, "remote": 0.25, "computed": 0.22}
    router = {"active_policy": "cost", "degraded": False, "requests": 1_234_567, "prompt_tokens": 987_654_321,
              "hit_rate": 0.781, "hit_rate_by_source": by, "regret_tokens": 123456, "index_precision": 0.99,
              "retries": 12, "nodes": {f"10.0.0.{i}-gpu0": node for i in range(3)}}
    return {"router": router, "metadata": {"live_nodes": 3, "indexed_blocks": 123456, "state_store": "memory"}}


def rendered(width: int) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width).print(render_stats(stats_doc()))
    return out.getvalue().splitlines()


def test_every_header_and_value_is_whole_in_80_columns() -> None:
    lines = rendered(80)
    assert max(map(len, lines)) <= 80 and not any("…" in line for line in lines)
    header = next(line for line in lines if line.startswith("node "))
    assert header.split() == ["node", "flight", "routed", "failed", "requests", "hit", "rate", "local", "remote", "miss"]
    assert lines[2].split() == ["1.2M", "987.7M", "78.1%", "123.5k", "0.99", "12"]
    row = next(line for line in lines if line.startswith("10.0.0.2-gpu0"))
    assert row.split() == ["10.0.0.2-gpu0", "3", "123.5k", "0", "123.5k", "87.3%", "12.3M", "1.2M", "1.2M"]


@pytest.mark.parametrize("width", [60, 40])
def test_narrower_cells_fold_and_lose_nothing(width: int) -> None:
    lines = rendered(width)
    assert max(map(len, lines)) <= width and not any("…" in line for line in lines)


def test_counts_are_exact_below_100k_and_short_above() -> None:
    assert [count(n) for n in (0, 99_999, 100_000, 1_234_567, 987_654_321, 2_500_000_000)] == [
        "0", "99999", "100.0k", "1.2M", "987.7M", "2.5G"]
