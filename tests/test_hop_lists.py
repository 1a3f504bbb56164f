"""docs/architecture.md's hop lists name real functions: every `radixmesh.module:Qual.name` in its
"Hop lists" section imports and resolves, so a rename or a move that forgets the page fails here."""

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
NAME = re.compile(r"`(radixmesh(?:\.\w+)+):(\w+(?:\.\w+)*)`")
HOP_ROW = re.compile(r"^\| (\d+) \| (.*?) \|", re.MULTILINE)


def section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same or a higher level."""
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n")
    after = re.search(rf"^#{{1,{len(level)}}} ", text[start + len(heading) + 2:], re.MULTILINE)
    return text[start: start + len(heading) + 2 + after.start()] if after else text[start:]


def resolves(module: str, qualname: str) -> bool:
    obj: object = importlib.import_module(module)
    for part in qualname.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return callable(obj)


def test_every_named_hop_resolves() -> None:
    names = set(NAME.findall(section(PAGE.read_text(), "## Hop lists")))
    assert len(names) > 40, names
    assert sorted(f"{m}:{q}" for m, q in names if not resolves(m, q)) == []


def test_both_lists_are_numbered_hops_each_naming_a_function() -> None:
    text = PAGE.read_text()
    for heading, first, last in (
        ("### A request, HTTP to engine", "radixmesh.cluster.api.openai_routes", "radixmesh.node_agent.engine.engine"),
        ("### A block hash, engine to router replica", "radixmesh.node_agent.engine.engine",
         "radixmesh.cluster.metadata.index"),
    ):
        rows = HOP_ROW.findall(section(text, heading))
        assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1)), heading
        assert all(NAME.search(hop) for _, hop in rows), heading
        assert NAME.search(rows[0][1]).group(1) == first, heading  # type: ignore[union-attr]
        assert f"`{last}:" in rows[-1][1], heading


def test_a_stale_name_is_caught() -> None:
    assert resolves("radixmesh.cluster.router.router", "Router.plan")
    assert not resolves("radixmesh.cluster.router.router", "Router.no_such_hop")
