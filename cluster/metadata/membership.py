"""Membership: which nodes are alive (leases), which incarnation they are (epochs), and how far their
event stream has been applied (sequence numbers).

A lease ends `lease_ttl_s` after the last register/heartbeat, measured on the injected clock, so
expiry tests need no sleeps. Epochs fence restarted nodes: the highest epoch ever seen for a node
is remembered even after its lease ends, and anything older is refused.
"""

import heapq
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum

from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.nodes import Lease, NodeInfo, NodeLoad

logger = logging.getLogger(__name__)


class StaleEpoch(Exception):
    """The caller is an older incarnation of a node than the one the service knows."""


class UnknownNode(Exception):
    """The node holds no live lease (never registered, or its lease ended): register again."""


@dataclass(slots=True)
class Member:
    """Live state of one registered node."""

    info: NodeInfo
    deadline: float
    """Clock time at which the lease ends."""
    last_seq: int = 0
    """Last event batch applied; 0 before any."""
    load: NodeLoad = field(default_factory=NodeLoad)
    recall_cursor: int = 0
    """The index's lost-block sequence number this node's leases have reported up to."""


class SeqVerdict(Enum):
    APPLY = "apply"
    DUPLICATE = "duplicate"
    GAP = "gap"


class Membership:
    """Leases, epochs and sequence numbers of every node. Not thread-safe."""

    def __init__(self, lease_ttl_s: float, clock: Callable[[], float]) -> None:
        if lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be positive, got {lease_ttl_s}")
        self.lease_ttl_s = lease_ttl_s
        self._clock = clock
        self._members: dict[NodeId, Member] = {}
        self._epochs: dict[NodeId, int] = {}
        self._deadlines: list[tuple[float, NodeId]] = []  # min-heap; stale entries skipped on pop

    def register(self, info: NodeInfo) -> tuple[Member, bool]:
        """Grant or renew `info.node_id`'s lease; True when the node starts with no indexed state.

        Raises StaleEpoch for an older epoch, ValueError when a live incarnation changes its info.
        """
        known = self._epochs.get(info.node_id, 0)
        if info.epoch < known:
            raise StaleEpoch(f"node {info.node_id} epoch {info.epoch} < known epoch {known}")
        live = self._members.get(info.node_id)
        if live is not None and live.info.epoch == info.epoch:
            if live.info != info:
                raise ValueError(f"node {info.node_id} epoch {info.epoch} registered with other fields")
            self._renew(live)
            return live, False
        member = Member(info, deadline=0.0)
        self._members[info.node_id] = member
        self._epochs[info.node_id] = info.epoch
        self._renew(member)
        return member, True

    def heartbeat(self, node: NodeId, epoch: int, load: NodeLoad) -> Member:
        """Renew a live lease and record the load; StaleEpoch / UnknownNode otherwise."""
        member = self.current(node, epoch)
        member.load = load
        self._renew(member)
        return member

    def current(self, node: NodeId, epoch: int) -> Member:
        """The live member for (node, epoch); raises StaleEpoch or UnknownNode."""
        known = self._epochs.get(node, 0)
        if epoch < known:
            raise StaleEpoch(f"node {node} epoch {epoch} < current epoch {known}")
        member = self._members.get(node)
        if member is None or member.info.epoch != epoch:
            raise UnknownNode(f"node {node} epoch {epoch} holds no lease: register first")
        return member

    @staticmethod
    def verdict(member: Member, seq: int) -> SeqVerdict:
        """How to treat event batch `seq` from `member` (batches count from 1 per epoch)."""
        if seq <= member.last_seq:
            return SeqVerdict.DUPLICATE
        return SeqVerdict.APPLY if seq == member.last_seq + 1 else SeqVerdict.GAP

    def expire(self) -> list[NodeId]:
        """Remove and return every member whose lease has ended by now."""
        now = self._clock()
        gone = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, node = heapq.heappop(self._deadlines)
            member = self._members.get(node)
            if member is not None and member.deadline <= now:
                del self._members[node]
                gone.append(node)
                logger.info("lease of node %s (epoch %d) ended", node, member.info.epoch)
        return gone

    def members(self) -> list[Member]:
        return list(self._members.values())

    def get(self, node: NodeId) -> Member | None:
        return self._members.get(node)

    def lease(self, member: Member, snapshot_required: bool, recalled: tuple[BlockHash, ...] = ()) -> Lease:
        return Lease(member.info.node_id, member.info.epoch, self.lease_ttl_s, member.last_seq + 1,
                     snapshot_required, recalled)

    def encode(self, node: NodeId) -> bytes:
        """The persistent record of a node: its highest epoch, and its lease while live."""
        member = self._members.get(node)
        record: dict[str, object] = {"epoch": self._epochs[node]}
        if member is not None:
            record["info"] = asdict(member.info)
            record["deadline"] = member.deadline
            record["load"] = asdict(member.load)
        return json.dumps(record).encode()

    def restore(self, node: NodeId, data: bytes) -> None:
        """Load a record written by `encode`; a lease already ended only restores the epoch fence, and
        so does a lease whose info this version cannot read (the node's next heartbeat then finds no
        lease and it registers again)."""
        record = json.loads(data)
        self._epochs[node] = max(self._epochs.get(node, 0), int(record["epoch"]))
        if "info" in record and record["deadline"] > self._clock():
            try:
                info = NodeInfo(**record["info"])
            except (TypeError, ValueError) as e:  # a record of an older NodeInfo (no block_bytes)
                logger.warning("node %s: lease record not restored (%s); it must register again", node, e)
                return
            member = Member(info, float(record["deadline"]), 0, NodeLoad(**record["load"]))
            self._members[node] = member
            heapq.heappush(self._deadlines, (member.deadline, node))

    def check_invariants(self) -> None:
        for node, member in self._members.items():
            assert member.info.node_id == node, f"member {node} holds info of {member.info.node_id}"
            assert self._epochs[node] == member.info.epoch, f"{node}: epoch {self._epochs[node]} != live"
            assert member.last_seq >= 0, f"{node}: last_seq {member.last_seq}"
            assert (member.deadline, node) in self._deadlines, f"{node}: deadline not scheduled"

    def _renew(self, member: Member) -> None:
        member.deadline = self._clock() + self.lease_ttl_s
        heapq.heappush(self._deadlines, (member.deadline, member.info.node_id))
