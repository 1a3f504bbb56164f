"""The structure viewer (bench/house.py --graph) follows our imports through the radixmesh/ symlinks:
grimp's graph of `radixmesh` has every layer, only downward edges between them, and the drawing
committed under docs/ is the one the imports make today. That the contracts themselves hold, and
can fail, is tests/test_layers.py's."""

from pathlib import Path

from tests.support.bench_scripts import load_bench

house = load_bench("house")
DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_graph_has_every_layer_and_only_downward_edges() -> None:
    nodes, edges = house.import_graph()
    assert {n.split(".")[0] for n in nodes} == set(house.PACKAGES)
    assert house.upward_edges(edges) == []
    # One edge per boundary the layers allow, seen through the mapping (none is a bare `cluster`).
    for edge in [("cluster.launch", "node_agent"), ("node_agent.memory", "common.prefix_cache"),
                 ("common.metadata", "proto.metadata"), ("node_agent.model", "kernels")]:
        assert edge in edges, edge
    # Inside cluster, only what starts agents reaches node_agent (launch and cli, and the bench, whose
    # engine simulator runs agents' engines on a virtual clock), and only its public face.
    assert sorted((a, b) for a, b in edges if a.startswith("cluster.") and b.startswith("node_agent")) == [
        ("cluster.bench", "node_agent"), ("cluster.cli", "node_agent"), ("cluster.launch", "node_agent")]


def test_an_upward_edge_is_reported() -> None:
    assert house.upward_edges({("proto.ids", "cluster.router"), ("cluster.router", "proto.ids")}) == [
        ("proto.ids", "cluster.router")]
    assert house.reduced(["a", "b", "c"], {("a", "b"), ("b", "c"), ("a", "c")}) == [("a", "b"), ("b", "c")]


def test_the_committed_drawing_is_current(tmp_path: Path) -> None:
    house.write_graph(tmp_path)
    for name in ("structure.dot", "structure.svg"):
        assert (DOCS / name).read_text() == (tmp_path / name).read_text(), (
            f"docs/{name} is stale: run `python bench/house.py --graph`")
