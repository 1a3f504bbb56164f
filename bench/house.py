"""The shape of the house in numbers, before and after: modules, the largest, reach-throughs into node
memory, duplicated machines, the test folders; and the import graph of the packages, drawn.

    python bench/house.py [--before REV] [--after REV] [--out DIR] [--smoke]
    python bench/house.py --graph [--docs DIR]

Each revision is exported with `git archive REV` into a temporary folder and surveyed there, both in
the same run, so the table never mixes a checkout with a memory of one. Prints the table and writes
DIR/house.json (default bench/results). A smoke run surveys HEAD twice (it takes a second, and needs
no history a shallow clone lacks), its JSON marked as a smoke run.

`--graph` builds the import graph of the installed `radixmesh` with grimp (import-linter's graph
library, which resolves `radixmesh.*` through the radixmesh/ symlinks as every other tool does) and
writes docs/structure.dot (every subpackage-level edge, for Graphviz) and docs/structure.svg (drawn
here, no Graphviz needed: the layers as bands, the edges that other paths imply left out).
"""

import argparse
import io
import json
import re
import subprocess
import tarfile
import tempfile
import tokenize
import tomllib
from collections import Counter
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
RESULTS = HERE / "bench" / "results"
DOCS = HERE / "docs"
PACKAGES = ("proto", "kernels", "common", "node_agent", "cluster")
BEFORE = "e691365"
"""Issue 39's baseline: HEAD before its items 1, 2, 4 and 6 landed."""
SMALL, LARGE = 30, 400
FACE = {"node_agent": "node_agent (public face)"}
"""node_agent's __init__ is its public face, the one door cluster.launch and cluster.cli use."""
COLOURS = {"cluster": "#fde2c8", "node_agent": "#d7e8fb", "common": "#d9f2d0", "kernels": "#efe0f7",
           "proto": "#eeeeee"}

# Code reaching through the engine or the agent into node memory's insides: `engine.memory.` and
# `.memory.tiers/gpu/host/disk/config`. A config chain (`config.engine.memory.pool`) is settings, not
# the live object, and is not counted; neither are imports, comments and strings.
REACH = re.compile(r"(?<!config\.)engine\.memory\.|(?<!config\.engine)\.memory\.(?:tiers|gpu|host|disk|config)\b")
POISSON = re.compile(r"\bexpovariate\(|\.exponential\(")
"""A drawn Poisson arrival: each module that draws its own is a load generator."""
DOUBLING = re.compile(r"\bmin\(.*(\b2(\.0)?\*|\*2(\.0)?\b)")
"""A hand-written doubling retry schedule (`min(2 * pause, max)`, `min(max, x * 2.0 ** n)`)."""
SYS_PATH = re.compile(r"\bsys\.path\.(insert|append)\(")
WIRE = re.compile(r"^(import|from) (msgspec|msgpack|ormsgpack)\b")
"""A module that encodes or decodes vLLM's KV-event wire (msgpack) itself."""


def code_lines(text: str) -> list[str]:
    """The module's logical lines as code only: tokens joined without spaces (but between two words),
    comments and strings (docstrings included) dropped, so patterns see `a.memory.gpu` and never
    prose about it."""
    lines: list[str] = []
    current: list[str] = []
    skip = {tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    skip |= {getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, n)}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NEWLINE:
            lines.append("".join(current))
            current = []
        elif tok.type not in skip:
            # A space only between two words (`return min`, `from x import`), none around operators.
            if current and word(current[-1][-1:]) and word(tok.string[:1]):
                current.append(" ")
            current.append(tok.string)
    return lines


def word(char: str) -> bool:
    return char.isalnum() or char == "_"


def not_imports(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith(("import", "from"))]


def py_files(root: Path, folder: str) -> list[Path]:
    return sorted(p for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts) \
        if (root / folder).is_dir() else []


def survey(root: Path) -> dict[str, object]:
    """The figures of the tree at ROOT (a checkout or an exported revision)."""
    rel = {p: p.relative_to(root).as_posix() for f in (*PACKAGES, "bench", "tests") for p in py_files(root, f)}
    code = {p: code_lines(p.read_text()) for p in rel}
    sizes = {rel[p]: len(p.read_text().splitlines()) for p in rel}
    modules = [p for p in rel if rel[p].split("/")[0] in PACKAGES and p.name != "__init__.py" and "_pb2" not in p.name]
    package_sizes = {rel[p]: sizes[rel[p]] for p in modules}
    largest = max(package_sizes, key=lambda k: package_sizes[k])
    # The issue counted bench/ among the large modules: one over 400 lines there reads as badly.
    big = {k: n for k, n in sizes.items()
           if n > LARGE and k.split("/")[0] in (*PACKAGES, "bench") and "_pb2" not in k}

    def area(path: str) -> str | None:
        if path == "node_agent/agent.py":
            return "node_agent/agent.py"
        if path.startswith("node_agent/memory/"):
            return None
        top = path.split("/")[0]
        return {"node_agent": "node_agent (rest)", "tests": "tests", "bench": "bench"}.get(top)

    reach: Counter[str] = Counter()
    reach_files: Counter[str] = Counter()
    for p, lines in code.items():
        if (where := area(rel[p])) is not None and (n := sum(len(REACH.findall(c)) for c in not_imports(lines))):
            reach[where] += n
            reach_files[rel[p]] = n
    shipped = [p for p in rel if rel[p].split("/")[0] in (*PACKAGES, "bench")]
    machines = {
        "load_generators": sorted(rel[p] for p in shipped if any(POISSON.search(c) for c in code[p])),
        "doubling_retry_schedules": sorted(rel[p] for p in shipped if any(DOUBLING.search(c) for c in code[p])),
        "bench_sys_path_inserts": sum(sum(bool(SYS_PATH.search(c)) for c in code[p])
                                      for p in shipped if rel[p].startswith("bench/")),
        "vllm_event_wire_codecs": sorted(rel[p] for p in shipped if any(WIRE.search(c) for c in code[p])),
    }
    tests = [p for p in rel if rel[p].startswith("tests/") and p.name.startswith("test_")]
    flat = Counter(p.parent.relative_to(root).as_posix() for p in tests)
    return {
        "modules": len(modules),
        "median_module_lines": sorted(package_sizes.values())[len(package_sizes) // 2],
        "largest_module": {"path": largest, "lines": package_sizes[largest]},
        f"modules_over_{LARGE}_lines": dict(sorted(big.items(), key=lambda kv: -kv[1])),
        f"modules_under_{SMALL}_lines": sum(n < SMALL for n in package_sizes.values()),
        "reach_throughs": {"total": sum(reach.values()), **dict(sorted(reach.items()))},
        "reach_throughs_per_file": dict(sorted(reach_files.items())),
        "duplicated_machines": machines,
        "test_files_per_folder": dict(sorted(flat.items())),
        "test_folders": len(flat),
        "largest_test_folder": max(flat.items(), key=lambda kv: kv[1]),
    }


def export(rev: str, into: Path) -> str:
    """`git archive REV` unpacked into INTO; returns the full commit id."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=HERE, check=True,
                         capture_output=True, text=True).stdout.strip()
    tar = subprocess.run(["git", "archive", sha], cwd=HERE, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="tar")
    return sha


def row_figures(s: dict[str, Any]) -> list[tuple[str, str]]:
    m = s["duplicated_machines"]
    r = s["reach_throughs"]
    return [
        ("modules (proto, kernels, common, node_agent, cluster)", str(s["modules"])),
        ("median module (lines)", str(s["median_module_lines"])),
        ("largest module (lines)", f"{s['largest_module']['lines']} {s['largest_module']['path']}"),
        (f"modules over {LARGE} lines (with bench/)", str(len(s[f"modules_over_{LARGE}_lines"]))),
        (f"modules under {SMALL} lines", str(s[f"modules_under_{SMALL}_lines"])),
        ("reach-throughs into node memory", str(r["total"])),
        ("  in node_agent/agent.py", str(r.get("node_agent/agent.py", 0))),
        ("  in node_agent (rest, not memory/)", str(r.get("node_agent (rest)", 0))),
        ("  in tests", str(r.get("tests", 0))),
        ("  in bench", str(r.get("bench", 0))),
        ("load generators (modules drawing Poisson arrivals)", str(len(m["load_generators"]))),
        ("doubling retry schedules", str(len(m["doubling_retry_schedules"]))),
        ("bench sys.path inserts", str(m["bench_sys_path_inserts"])),
        ("vLLM KV-event wire codecs", str(len(m["vllm_event_wire_codecs"]))),
        ("test folders", str(s["test_folders"])),
        ("largest flat test folder (files)", "{1} {0}".format(*s["largest_test_folder"])),
    ]


def compare(before: str, after: str) -> dict[str, Any]:
    """Both revisions surveyed in one run, each from its own `git archive`."""
    with tempfile.TemporaryDirectory() as tmp:
        out: dict[str, Any] = {}
        for side, rev in (("before", before), ("after", after)):
            root = Path(tmp) / side
            root.mkdir()
            sha = export(rev, root)
            out[side] = {"rev": rev, "commit": sha, **survey(root)}
        return out


# ---- the structure viewer


def subpackage(module: str) -> str:
    """radixmesh.cluster.api.app -> cluster.api; radixmesh.node_agent.agent -> node_agent.agent;
    kernels are one node (one family per module, no subpackages to tell apart)."""
    parts = module.split(".")[1:]
    return parts[0] if parts[0] == "kernels" or len(parts) == 1 else ".".join(parts[:2])


def import_graph() -> tuple[list[str], set[tuple[str, str]]]:
    """Nodes and edges (importer, imported) between subpackages, as grimp reads the imports."""
    import grimp

    graph = grimp.build_graph("radixmesh", cache_dir=None)
    # The five layers' modules; radixmesh.import_name (the mapping's own guard, which every
    # package's __init__ calls) sits under all of them and is left out.
    ours = [m for m in graph.modules if m.split(".")[1:2] and m.split(".")[1] in PACKAGES]
    nodes = sorted({subpackage(m) for m in ours})
    edges = {(subpackage(m), subpackage(i)) for m in ours for i in graph.find_modules_directly_imported_by(m)
             if i.split(".")[1:2] and i.split(".")[1] in PACKAGES}
    edges = {(a, b) for a, b in edges if a != b}
    # A package's own __init__ (radixmesh.proto, ...) only steps aside for a bare import: no edges.
    linked = {n for e in edges for n in e}
    return [n for n in nodes if n in linked or "." in n], edges


def layer_order() -> list[list[str]]:
    """The top-level layers, highest first, as the import-linter contract in pyproject.toml lists them."""
    config = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in config if c["id"] == "radixmesh-layers")
    return [[name.strip().removeprefix("radixmesh.") for name in layer.split("|")] for layer in layers]


def upward_edges(edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """Edges whose importer's top-level package sits in a lower layer than, or beside, the imported's."""
    rank = {pkg: i for i, layer in enumerate(layer_order()) for pkg in layer}
    return sorted((a, b) for a, b in edges
                  if a.split(".")[0] != b.split(".")[0] and rank[a.split(".")[0]] >= rank[b.split(".")[0]])


def ranked(nodes: list[str], edges: set[tuple[str, str]]) -> list[str]:
    """The nodes, each after everything it imports (graphlib's order); CycleError on an import cycle."""
    imports: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        imports[a].add(b)
    return list(TopologicalSorter(imports).static_order())


def reduced(nodes: list[str], edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The edges no longer path implies (the transitive reduction): a -> c stays only when no
    a -> b -> ... -> c says it already."""
    below: dict[str, set[str]] = {}
    for n in ranked(nodes, edges):
        direct = {b for a, b in edges if a == n}
        below[n] = direct.union(*(below[b] for b in direct))
    return sorted((a, c) for a, c in edges if not any(c in below[b] for x, b in edges if x == a and b != c))


def dot(nodes: list[str], edges: set[tuple[str, str]]) -> str:
    """Graphviz source: one box per top-level package (pyproject's layers, top to bottom, held in
    place by invisible edges through one hidden node between two layers), every import edge, those
    a path of others already implies drawn faint (and left out of the layout) so the layers read."""
    layers = layer_order()
    lines = ["// radixmesh's subpackage import graph (an edge: importer -> imported), made by",
             "// `python bench/house.py --graph` from grimp's graph; `dot -Tsvg` draws it.",
             "digraph radixmesh {",
             ('  rankdir=TB; newrank=true; ranksep=0.35; node [shape=box, style=filled, fontsize=10, '
              'fontname="Helvetica"];')]
    for i, layer in enumerate(layers):
        for pkg in layer:
            lines.append(f'  subgraph "cluster_{pkg}" {{ label="{pkg}"; fontname="Helvetica-Bold"; '
                         f'style=dashed; node [fillcolor="{COLOURS[pkg]}"];')
            lines += [f'    "{n}";' for n in nodes if n.split(".")[0] == pkg]
            lines.append("  }")
        if i + 1 < len(layers):  # everything of this layer above everything of the next
            below = [n for n in nodes if n.split(".")[0] in layers[i + 1]]
            lines.append(f'  "layer{i}" [style=invis, shape=point, width=0];')
            lines += [f'  "{n}" -> "layer{i}" [style=invis];' for n in nodes if n.split(".")[0] in layer]
            lines += [f'  "layer{i}" -> "{n}" [style=invis];' for n in below]
    implied = edges - set(reduced(nodes, edges))
    faint = ' [color="#00000026", arrowsize=0.5, constraint=false]'
    lines += [f'  "{a}" -> "{b}"{faint if (a, b) in implied else ""};' for a, b in sorted(edges)]
    return "\n".join([*lines, "}", ""])


def svg(nodes: list[str], edges: set[tuple[str, str]]) -> str:
    """The layers as bands, top to bottom (pyproject's contract), each package's subpackages in rows
    by rank inside its band (the longest import chain below it within the package), so every edge
    points down. Transitive edges are left out: a -> c is drawn only when no path a -> b -> c says
    it already (docs/structure.dot keeps them all)."""
    drawn = reduced(nodes, edges)
    band = {pkg: i for i, layer in enumerate(layer_order()) for pkg in layer}
    inside: dict[str, int] = {}
    for n in ranked(nodes, edges):
        pkg = n.split(".")[0]
        inside[n] = 1 + max((inside[b] for a, b in edges if a == n and b.split(".")[0] == pkg), default=-1)
    rows: dict[tuple[int, int], list[str]] = {}
    for n in sorted(nodes, key=lambda n: (PACKAGES.index(n.split(".")[0]), n)):
        rows.setdefault((band[n.split(".")[0]], -inside[n]), []).append(n)
    w, h, gap_x, gap_y, pad, label = 168.0, 22.0, 12.0, 40.0, 16.0, 120.0
    width = label + pad * 2 + max(len(r) for r in rows.values()) * (w + gap_x)
    where: dict[str, tuple[float, float]] = {}
    bands: dict[int, list[float]] = {}
    y = pad
    keys = sorted(rows)
    for i, key in enumerate(keys):
        if i and key[0] != keys[i - 1][0]:
            y += gap_y / 2  # a little more air between layers
        row = rows[key]
        x0 = label + (width - label - len(row) * (w + gap_x) + gap_x) / 2
        for j, n in enumerate(row):
            where[n] = (x0 + j * (w + gap_x), y)
        bands.setdefault(key[0], []).append(y)
        y += h + gap_y
    total = y + pad
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{total:.0f}" '
            'font-family="sans-serif" font-size="11">'),
           ('<defs><marker id="a" viewBox="0 0 6 6" refX="6" refY="3" markerWidth="6" markerHeight="6" '
            'orient="auto"><path d="M0,0 L6,3 L0,6 z" fill="#777"/></marker></defs>'),
           f'<rect width="{width:.0f}" height="{total:.0f}" fill="white"/>']
    for level, ys in sorted(bands.items()):
        top, bottom = ys[0] - gap_y / 4, ys[-1] + h + gap_y / 4
        out.append(f'<rect x="4" y="{top:.0f}" width="{width - 8:.0f}" height="{bottom - top:.0f}" fill="none" '
                   'stroke="#bbb" stroke-dasharray="4 3"/>')
        out.append(f'<text x="10" y="{top + 16:.0f}" font-weight="bold">{" | ".join(layer_order()[level])}</text>')
    for i, (a, b) in enumerate(drawn):
        (xa, ya), (xb, yb) = where[a], where[b]
        x1, y1, x2, y2 = xa + w / 2, ya + h, xb + w / 2, yb
        # An edge over more than one row bows aside (alternately left and right), so it does not run
        # through the boxes of the rows it passes.
        bow = 0.0 if y2 - y1 <= gap_y * 1.6 else (1 if i % 2 else -1) * (w / 2 + gap_x / 2)
        out.append(f'<path d="M{x1:.0f},{y1:.0f} C{x1 + bow:.0f},{y1 + gap_y:.0f} {x2 + bow:.0f},{y2 - gap_y:.0f} '
                   f'{x2:.0f},{y2:.0f}" fill="none" stroke="#888" stroke-width="0.8" marker-end="url(#a)"/>')
    for n, (x, y) in sorted(where.items()):
        out.append(f'<rect x="{x:.0f}" y="{y:.0f}" width="{w:.0f}" height="{h:.0f}" rx="3" '
                   f'fill="{COLOURS[n.split(".")[0]]}" stroke="#555"/>'
                   f'<text x="{x + w / 2:.0f}" y="{y + 15:.0f}" text-anchor="middle">{FACE.get(n, n)}</text>')
    return "\n".join([*out, "</svg>", ""])


def write_graph(docs: Path) -> dict[str, object]:
    nodes, edges = import_graph()
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "structure.dot").write_text(dot(nodes, edges))
    (docs / "structure.svg").write_text(svg(nodes, edges))
    return {"nodes": len(nodes), "edges": len(edges), "upward_edges": upward_edges(edges)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=BEFORE, help=f"revision before (default {BEFORE}, issue 39's baseline)")
    ap.add_argument("--after", default="HEAD", help="revision after (default HEAD)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for house.json")
    ap.add_argument("--smoke", action="store_true", help="survey HEAD twice; mark the JSON as a smoke run")
    ap.add_argument("--graph", action="store_true", help="write the import graph (DOT and SVG) under --docs")
    ap.add_argument("--docs", type=Path, default=DOCS, help="folder for structure.dot/.svg (default docs/)")
    args = ap.parse_args()
    if args.graph:
        print(json.dumps(write_graph(args.docs)))
        return
    result = compare("HEAD", "HEAD") if args.smoke else compare(args.before, args.after)
    if args.smoke:
        result["smoke"] = True
    before, after = result["before"], result["after"]
    print(f"{'':52} {'before ' + before['commit'][:7]:>32} {'after ' + after['commit'][:7]:>32}")
    for (name, b), (_, a) in zip(row_figures(before), row_figures(after), strict=True):
        print(f"{name:52} {b:>32} {a:>32}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "house.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
