"""The bench's picture: TTFT p99 and goodput against offered load, one line per arm (the knee is where
goodput leaves the offered-load diagonal).

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

    cells = doc.get("means", doc["cells"])  # several seeds: their means
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
    left.set_xscale("log")
    left.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    left.set_yscale("log")
    left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 20, not 2 x 10^1
    left.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    left.legend(fontsize=8)
    for arm in arms:
        mine = sorted((c for c in cells if c["arm"] == arm), key=lambda c: c["rate_rps"])
        right.plot([c["rate_rps"] for c in mine], [c["goodput_rps"] for c in mine], marker="o", label=arm)
    right.plot([rates[0], rates[-1]], [rates[0], rates[-1]], color="grey", linestyle=":", linewidth=1,
               label="offered")
    knee = (doc.get("headline") or {}).get("knee")
    if knee:
        right.axvline(knee["rate_rps"], color="grey", linestyle="--", linewidth=1, label="cost's knee")
    right.set_xscale("log")
    right.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    right.set(xlabel="offered load (requests/s)", ylabel="goodput (requests/s within SLO)",
              title=f"goodput (TTFT <= {slo['ttft_s']:g} s, TPOT <= {slo['itl_s']:g} s)")
    right.legend(fontsize=8)
    settings = doc["settings"]
    modeled = "MODELED engine: " if "modeled" in str(settings.get("engine", {}).get("label", "")) else ""
    fig.suptitle(f"{modeled}radixmesh bench: {settings['workload']['name']}, {settings['cluster']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
