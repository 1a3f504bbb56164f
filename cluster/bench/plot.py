"""The bench's picture: TTFT p99 against offered load, one line per arm, and goodput bars per rate.

matplotlib is the optional `bench` extra, so it is imported when a picture is drawn: `plot` raises
ImportError without it, and the bench writes its JSON alone.
"""

from pathlib import Path
from typing import Any


def plot(doc: dict[str, Any], path: Path) -> None:
    """Draw `doc` (report.document) into the PNG at `path`; ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    cells = doc["cells"]
    arms = list(dict.fromkeys(c["arm"] for c in sorted(cells, key=lambda c: c["order"])))
    rates = sorted({c["rate_rps"] for c in cells})
    slo = doc["settings"]["slo"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm in arms:
        # a cell that sent nothing has no TTFT (0), which a log axis cannot show
        mine = sorted((c for c in cells if c["arm"] == arm and c["ttft_s"]["p99"] > 0), key=lambda c: c["rate_rps"])
        left.plot([c["rate_rps"] for c in mine], [c["ttft_s"]["p99"] for c in mine], marker="o", label=arm)
    left.axhline(slo["ttft_s"], color="grey", linestyle="--", linewidth=1, label="TTFT SLO")
    left.set(xlabel="offered load (requests/s)", ylabel="TTFT p99 (s)", title="TTFT p99 against offered load")
    left.set_yscale("log")
    left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 20, not 2 x 10^1
    left.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    left.legend(fontsize=8)
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        by_rate = {c["rate_rps"]: c["goodput_rps"] for c in cells if c["arm"] == arm}
        right.bar([j + (i - (len(arms) - 1) / 2) * width for j in range(len(rates))],
                  [by_rate.get(r, 0.0) for r in rates], width, label=arm)
    right.set_xticks(range(len(rates)), [f"{r:g}" for r in rates])
    right.set(xlabel="offered load (requests/s)", ylabel="goodput (requests/s within SLO)",
              title=f"goodput (TTFT <= {slo['ttft_s']:g} s, TPOT <= {slo['itl_s']:g} s)")
    right.legend(fontsize=8)
    settings = doc["settings"]
    fig.suptitle(f"radixmesh bench: {settings['workload']['name']}, {settings['cluster']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
