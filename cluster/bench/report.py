"""The results document: the cells, their ratios against round_robin and caching off, the knee and the
headline; and the picture beside it.

The knee is the highest offered rate at which `cost` meets the SLO for at least `knee_attainment`
of the requests offered (the lowest rate, marked unmet, when none does); the headline compares the
arms there. Both definitions are written into the document. A bench run at several seeds is read at
the seeds' means (`means`), each seed's cells kept beside them.
"""

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from radixmesh.cluster.bench.plot import plot

logger = logging.getLogger(__name__)

KNEE_ARM = "cost"
HEADLINE_RATIOS = (("goodput_cost_over_round_robin", "goodput_rps", "round_robin"),
                   ("goodput_cost_over_prefix_affinity", "goodput_rps", "prefix_affinity"),
                   ("ttft_p99_cost_over_off", "ttft_p99", "off"))
"""(headline key, figure, the arm cost is divided by)."""
GOALS = {"goodput_cost_over_round_robin": (">=", 2.0), "goodput_cost_over_prefix_affinity": (">=", 1.2),
         "ttft_p99_cost_over_off": ("<=", 0.5)}
"""The issue's goals for the headline ratios."""


def _figure(cell: dict[str, Any], name: str) -> float:
    return float(cell["ttft_s"]["p99"]) if name == "ttft_p99" else float(cell[name])


def _ratio(a: float, b: float) -> float | None:
    """a / b; None when b is 0 (JSON null: no ratio, rather than infinity)."""
    return a / b if b else None


def _cell(cells: Sequence[dict[str, Any]], arm: str, rate: float) -> dict[str, Any] | None:
    return next((c for c in cells if c["arm"] == arm and c["rate_rps"] == rate), None)


def with_ratios(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each cell with "ratios": its goodput and TTFT p99 over round_robin's and off's at the same rate."""
    out = []
    for c in cells:
        ratios: dict[str, float | None] = {}
        for base in ("round_robin", "off"):
            other = _cell(cells, base, c["rate_rps"])
            if other is not None:
                for figure in ("goodput_rps", "ttft_p99"):
                    key = f"{figure.removesuffix('_rps')}_over_{base}"
                    ratios[key] = _ratio(_figure(c, figure), _figure(other, figure))
        out.append({**c, "ratios": ratios})
    return out


_SUMMED = ("prompt_tokens", "prompt_tokens_computed", "cached_tokens_reported", "router_requests", "regret_tokens")
_AVERAGED = ("goodput_rps", "slo_attainment", "hit_rate", "output_tokens_per_s")
_QUANTILES = ("ttft_s", "ttft_later_turns_s", "itl_s", "e2e_s")


def seed_means(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per arm and rate (in the order of their first cells): a cell run at one seed as it is, else the
    seeds' mean of each rate-like figure and quantile, their sums of counts, and the spread (lowest,
    highest) of goodput and attainment; no decisions report (each seed has its own)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["arm"], c["rate_rps"]), []).append(c)
    rows = []
    for (arm, rate), group in groups.items():
        if len(group) == 1:
            rows.append(group[0])
            continue
        n = len(group)
        row: dict[str, Any] = {"arm": arm, "rate_rps": rate, "order": group[0]["order"],
                               "seeds": [c.get("seed") for c in group],
                               "interrupted": any(c["interrupted"] for c in group)}
        row |= {k: sum(c[k] for c in group) / n for k in _AVERAGED}
        row |= {k: sum(c[k] for c in group) for k in _SUMMED}
        row |= {k: {q: sum(c[k].get(q, 0.0) for c in group) / n for q in group[0][k]} for k in _QUANTILES}
        row["requests"] = {o: sum(c["requests"][o] for c in group) for o in group[0]["requests"]}
        row["spread"] = {k: [min(c[k] for c in group), max(c[k] for c in group)] for k in ("goodput_rps",
                                                                                       "slo_attainment")}
        rows.append(row)
    return rows


def knee(cells: Sequence[dict[str, Any]], attainment: float) -> dict[str, Any] | None:
    """The knee of the KNEE_ARM's completed cells (None without any)."""
    mine = sorted((c for c in cells if c["arm"] == KNEE_ARM and not c["interrupted"]), key=lambda c: c["rate_rps"])
    if not mine:
        return None
    meeting = [c for c in mine if c["slo_attainment"] >= attainment]
    chosen = meeting[-1] if meeting else mine[0]
    return {"rate_rps": chosen["rate_rps"], "met": bool(meeting), "slo_attainment": chosen["slo_attainment"],
            # met at the highest rate run: the real knee may lie above it (run higher rates to find it)
            "at_highest_rate_run": bool(meeting) and chosen is mine[-1],
            "definition": f"the highest offered rate at which {KNEE_ARM} meets the SLO for at least "
                          f"{attainment:.0%} of the requests offered (met: false = no rate did; the lowest "
                          "rate is used)"}


def headline(cells: Sequence[dict[str, Any]], workload: str, attainment: float) -> dict[str, Any] | None:
    """cost against round_robin, prefix_affinity and off at the knee, the goals, and whether any cache
    arm was worse than off on TTFT p99 at any rate."""
    k = knee(cells, attainment)
    if k is None:
        return None
    cost = _cell(cells, KNEE_ARM, k["rate_rps"])
    assert cost is not None
    out: dict[str, Any] = {"workload": workload, "knee": k}
    for key, figure, base in HEADLINE_RATIOS:
        other = _cell(cells, base, k["rate_rps"])
        out[key] = None if other is None else _ratio(_figure(cost, figure), _figure(other, figure))
    out["goals_met"] = {key: None if out[key] is None else (out[key] >= bound if op == ">=" else out[key] <= bound)
                        for key, (op, bound) in GOALS.items()}
    offs = {c["rate_rps"]: _figure(c, "ttft_p99") for c in cells if c["arm"] == "off"}
    worse = [{"arm": c["arm"], "rate_rps": c["rate_rps"]} for c in cells
             if c["arm"] != "off" and c["rate_rps"] in offs and _figure(c, "ttft_p99") > offs[c["rate_rps"]]]
    out["cache_arms_worse_than_off_on_ttft_p99"] = worse if offs else None
    return out


def document(settings: dict[str, Any], cells: Sequence[dict[str, Any]], *, workload: str, attainment: float,
             interrupted: bool, complete: bool) -> dict[str, Any]:
    """The whole results JSON. `complete`: every cell ran (False while running, or after a stop). Cells
    run at several seeds also give `means` (seed_means), and the knee and headline are read from those."""
    means = seed_means(cells)
    several = len(means) < len(cells)
    rows = with_ratios(means)
    doc = {"headline": headline(rows, workload, attainment), "settings": settings,
           "complete": complete, "interrupted": interrupted, "cells": with_ratios(cells) if several else rows}
    if several:
        doc["means"] = rows
    return doc


def write(doc: dict[str, Any], out_dir: Path, *, picture: bool = True) -> tuple[Path, Path | None]:
    """bench.json and (with `picture`, and matplotlib) bench.png in `out_dir`; the PNG's path or None."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "bench.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    if not picture:
        return path, None
    png = out_dir / "bench.png"
    try:
        plot(doc, png)
    except ImportError:  # matplotlib is the optional `bench` extra
        logger.warning("no matplotlib (pip install 'radixmesh[bench]'): bench.png not drawn")
        return path, None
    return path, png
