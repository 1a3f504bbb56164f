"""The shape of the house in numbers: modules per folder, the largest module, modules under 30 lines,
and the test files' layout, for a checkout at ROOT (default: this one).

    python bench/house.py [ROOT] [--out DIR] [--smoke]

Issue 24's before/after table comes from running it on two checkouts. Prints a table and, as the last
line, one JSON object (also written to DIR/house.json, default bench/results, when ROOT is this checkout).
A smoke run is the same survey (it takes milliseconds), its JSON marked as a smoke run.
"""

import argparse
import json
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
RESULTS = HERE / "bench" / "results"
PACKAGES = ("proto", "kernels", "common", "node_agent", "cluster")
SMALL = 30


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def survey(root: Path) -> dict[str, object]:
    modules = [p for pkg in PACKAGES if (root / pkg).is_dir() for p in sorted((root / pkg).rglob("*.py"))
               if p.name != "__init__.py" and "_pb2" not in p.name and "__pycache__" not in p.parts]
    per_folder = Counter(p.parent.relative_to(root).as_posix() for p in modules)
    sizes = {p.relative_to(root).as_posix(): lines(p) for p in modules}
    largest = max(sizes, key=lambda k: sizes[k])
    tests = [p for p in (root / "tests").rglob("test_*.py") if "__pycache__" not in p.parts]
    test_folders = Counter(p.parent.relative_to(root).as_posix() for p in tests)
    return {
        "modules": len(modules),
        "modules_per_folder": dict(sorted(per_folder.items())),
        "largest_module": {"path": largest, "lines": sizes[largest]},
        "modules_under_30_lines": sorted(k for k, n in sizes.items() if n < SMALL),
        "median_module_lines": sorted(sizes.values())[len(sizes) // 2],
        "test_modules_per_folder": dict(sorted(test_folders.items())),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", type=Path, default=HERE)
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for house.json")
    ap.add_argument("--smoke", action="store_true", help="mark the JSON as a smoke run")
    args = ap.parse_args()
    root = args.root.resolve()
    s = survey(root)
    if args.smoke:
        s["smoke"] = True
    print(f"{'folder':40} modules")
    for folder, n in s["modules_per_folder"].items():  # type: ignore[attr-defined]
        print(f"{folder:40} {n}")
    print(f"modules: {s['modules']}, median {s['median_module_lines']} lines; largest {s['largest_module']}")
    small = s["modules_under_30_lines"]
    print(f"under {SMALL} lines: {len(small)}: {', '.join(small)}")  # type: ignore[arg-type]
    print("test modules per folder:", s["test_modules_per_folder"])
    if root == HERE:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "house.json").write_text(json.dumps(s, indent=1) + "\n")
    print(json.dumps(s))


if __name__ == "__main__":
    main()
