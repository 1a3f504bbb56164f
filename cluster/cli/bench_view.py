"""How `radixmesh bench` shows a run: a progress bar per arm, and the results table."""

from typing import Any

from rich.progress import Progress, TaskID
from rich.table import Table


class ArmBars:
    """A progress bar per arm (BenchProgress): its requests over all rates."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}

    def start(self, totals: dict[str, int]) -> None:
        self._tasks = {arm: self._progress.add_task(arm, total=total) for arm, total in totals.items()}

    def cell(self, arm: str, rate: float, requests: int) -> None:
        self._progress.update(self._tasks[arm], description=f"{arm} @ {rate:g}/s")

    def done(self, arm: str) -> None:
        self._progress.advance(self._tasks[arm])

    def more(self, requests: int) -> None:
        for task in self._tasks.values():
            self._progress.update(task, total=(self._progress.tasks[task].total or 0) + requests)


def results_table(doc: dict[str, Any]) -> Table:
    """Every cell a row (several seeds: their means). Requests that never finished are a column of their own,
    and a cell whose router saw no prompt token has no hit rate ("-", not 0%): a busy box's empty cell must
    not read as a cold cache."""
    table = Table(title=f"radixmesh bench: {doc['settings']['workload']['name']}, {doc['settings']['cluster']}")
    for name in ("arm", "rate/s", "goodput/s", "SLO met", "TTFT p50", "TTFT p99", "ITL p99", "hit rate",
                 "429", "failed", "unfinished", "vs round_robin", "vs off", "TTFT real/est p50", "left behind"):
        table.add_column(name, justify="left" if name == "arm" else "right")

    for c in sorted(doc.get("means", doc["cells"]), key=lambda c: (c["rate_rps"], c["arm"])):
        table.add_row(c["arm"], f"{c['rate_rps']:g}", f"{c['goodput_rps']:.3f}", f"{c['slo_attainment']:.0%}",
                      f"{c['ttft_s']['p50']:.2f} s", f"{c['ttft_s']['p99']:.2f} s", f"{c['itl_s']['p99'] * 1e3:.0f} ms",
                      f"{c['hit_rate']:.1%}" if c["prompt_tokens"] else "-", str(c["requests"]["refused"]),
                      str(c["requests"]["failed"]), str(c["requests"]["unfinished"]),
                      times(c["ratios"].get("goodput_over_round_robin")), times(c["ratios"].get("goodput_over_off")),
                      *_decisions(c.get("decisions")))
    return table


def _decisions(report: dict[str, Any] | None) -> tuple[str, str]:
    """The cell's calibration: realized over estimated TTFT (median), and the share of decisions that
    left a longer cached prefix behind."""
    if not report or not report["decisions"]:
        return "-", "-"
    ttft = report["calibration"]["ttft"]
    return times(ttft["p50"] if ttft else None), f"{report['left_behind']['share']:.0%}"


def times(v: float | None) -> str:
    """A ratio as the table shows it (\"-\" for none)."""
    return "-" if v is None else f"{v:.2f}x"
