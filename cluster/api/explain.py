"""`radixmesh route`'s answer: where one request went, why, and where its prompt tokens came from."""

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from radixmesh.cluster.router.results import RouterResult
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.plan import ServeStats
from radixmesh.proto.serve.tokens import TokenSources

ROUTE_PATH = "/radixmesh/route"
"""The router's endpoint that serves one request and answers with its RouteReport."""


@dataclass(frozen=True, slots=True)
class CandidateLine:
    """One node as the policy saw it."""

    node: NodeId
    gpu_blocks: int
    local_blocks: int
    inflight: int
    queued_tokens: int


@dataclass(frozen=True, slots=True)
class RouteReport:
    """The decision, the policy's reason, what every candidate looked like, and the realized stats."""

    node: NodeId
    policy: str
    reason: str
    local_blocks: int
    pull_from: NodeId | None
    pull_blocks: int
    est_ttft_s: float
    metadata_used: bool
    attempts: int
    ttft_s: float
    candidates: tuple[CandidateLine, ...]
    stats: ServeStats
    text: str


def explain(result: RouterResult, text: str) -> RouteReport:
    """The report of a finished request (`text`: its decoded output)."""
    d, routed = result.routed.decision, result.routed
    lines = tuple(CandidateLine(v.node, v.gpu_blocks, v.local_blocks, v.inflight, v.queued_tokens)
                  for v in routed.view.nodes)
    return RouteReport(result.result.node, routed.policy, d.reason, d.local_blocks, d.pull_from, d.pull_blocks,
                       d.est_ttft_s, routed.metadata_used, result.attempts, result.ttft_s, lines,
                       result.result.stats, text)


def format_report(doc: dict[str, Any]) -> str:
    """Plain lines for the terminal, from a RouteReport as JSON (asdict)."""
    r = SimpleNamespace(**doc)
    s = SimpleNamespace(**doc["stats"])
    tokens = TokenSources(**doc["stats"]["tokens"])
    r.candidates = [SimpleNamespace(**c) for c in doc["candidates"]]
    out = [
        f"node       {r.node}   (policy {r.policy}{'' if r.metadata_used else ', metadata service unreachable'})",
        f"why        {r.reason}",
        f"plan       {r.local_blocks} local block(s)"
        + (f", {r.pull_blocks} pulled from {r.pull_from}" if r.pull_from else "")
        + f", estimated TTFT {r.est_ttft_s * 1e3:.1f} ms",
        (f"prompt     {tokens.prompt} tokens: local gpu {tokens.local_gpu}, local host {tokens.local_host}, "
         f"local disk {tokens.local_disk}, remote {tokens.remote}, computed {tokens.computed}"),
        f"pull       {s.pull_bytes} bytes in {s.pull_seconds * 1e3:.1f} ms" + (" (failed, recomputed)"
                                                                              if s.pull_failed else ""),
        f"timing     TTFT {r.ttft_s * 1e3:.1f} ms at the router, {r.attempts} attempt(s)",
        "candidates " + ", ".join(f"{c.node}: gpu {c.gpu_blocks}/any {c.local_blocks} blocks, "
                                  f"{c.inflight} in flight" for c in r.candidates),
        f"output     {r.text!r}",
    ]
    return "\n".join(out)
