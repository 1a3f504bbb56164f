"""What one step of bench/gpu_check.py leaves behind: its rows, whether every check in them held, a summary,
and why it was skipped, in one JSON file that the step rewrites after every row. A step stopped at its time
budget is killed mid-way; what it had written is still its result."""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

StepStatus = Literal["running", "ok", "skipped", "failed", "timeout", "error"]
"""running/ok/skipped are written by the step itself; failed (a check did not hold), timeout (killed at
its budget) and error (crashed) are what gpu_check concludes from how the step's process ended."""


@dataclass(slots=True)
class StepLog:
    """The rows of one step as it runs, mirrored to `path` (None: kept in memory only)."""

    path: Path | None
    rows: list[dict[str, object]] = field(default_factory=list)
    correct: bool = True
    """False once any row's check failed."""
    summary: dict[str, object] = field(default_factory=dict)
    status: StepStatus = "running"
    reason: str | None = None
    """Why the step was skipped."""

    def record(self, kind: str, ok: bool | None = None, **figures: object) -> None:
        """One row; `ok` is the row's check (None: a row with figures only)."""
        self.correct = self.correct and ok is not False
        self.rows.append({"kind": kind, **({} if ok is None else {"ok": ok}), **figures})
        verdict = "" if ok is None else ("OK" if ok else "FAIL")
        print(kind, " ".join(f"{k}={v}" for k, v in figures.items()), verdict, flush=True)
        self.flush()

    def finish(self, **summary: object) -> None:
        self.summary.update(summary)
        self.status = "ok"
        self.flush()

    def skip(self, reason: str) -> None:
        print(f"skipped: {reason}", flush=True)
        self.status, self.reason = "skipped", reason
        self.flush()

    def as_dict(self) -> dict[str, object]:
        return {"status": self.status, "reason": self.reason, "correct": self.correct, "summary": self.summary,
                "rows": self.rows}

    def flush(self) -> None:
        if self.path is None:
            return
        # Written beside and renamed into place: a kill mid-write leaves the previous complete file.
        part = self.path.with_suffix(".part")
        part.write_text(json.dumps(self.as_dict()) + "\n")
        part.replace(self.path)


def read_step(path: Path) -> dict[str, object] | None:
    """What a step wrote, or None when it wrote nothing (it died before its first row)."""
    try:
        loaded = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    assert isinstance(loaded, dict), path
    return loaded
