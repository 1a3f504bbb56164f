"""The pull a ServePlan asks of its serving node: the blocks [local, end) of the agent's serve diagram,
streamed from the planned peer while the request waits in the engine's queue (followed as the peer
computes them, for a streamed hand-off: PullPlan.follow), then landed."""

from radixmesh.node_agent.engine.runner import EngineRunner
from radixmesh.node_agent.memory.sequence import PendingPrefix
from radixmesh.node_agent.transfer.owner_endpoint import parse_address
from radixmesh.node_agent.transfer.plane import Pulled, TransferPlane
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.limits import InvalidRequest, usable_prefix_blocks
from radixmesh.proto.serve.plan import ServePlan


def check_pull(plan: ServePlan, node: NodeId, block_size: int) -> None:
    """InvalidRequest for a pull no node could make: past the prompt's full blocks, from the serving
    node itself, or at an address that does not parse."""
    if plan.pull is None:
        return
    full = len(plan.prompt_token_ids) // block_size
    end = plan.pull.first_block + plan.pull.num_blocks
    if end > full:
        raise InvalidRequest(f"pull of blocks [{plan.pull.first_block}, {end}) runs past the prompt's "
                             f"{full} full blocks")
    if plan.pull.peer == node:
        raise InvalidRequest("a plan cannot pull from the serving node itself")
    try:
        parse_address(plan.pull.peer, plan.pull.address)
    except ValueError as e:
        raise InvalidRequest(str(e)) from None


def pending_prefix(plan: ServePlan, block_size: int, transfer: TransferPlane) -> PendingPrefix | None:
    """What the engine should pull for `plan`: its planned blocks up to the last usable one (the
    engine skips those held here by then); None without a pull `transfer` can make."""
    if plan.pull is None or not transfer.reaches(plan.pull.peer, plan.pull.address):
        return None
    end = plan.pull.first_block + plan.pull.num_blocks
    return PendingPrefix(min(end, usable_prefix_blocks(len(plan.prompt_token_ids), block_size)))


async def pull_prefix(plan: ServePlan, pending: PendingPrefix, transfer: TransferPlane,
                      runner: EngineRunner) -> Pulled:
    """Stream `pending`'s blocks from the planned peer, then land them, however the stream ended
    (cancelled included: its channel is closed by then, so nothing writes the blocks any more)."""
    assert plan.pull is not None
    pulled = Pulled.nothing(failed=True)
    try:
        pulled = await transfer.receive(plan.pull.peer, plan.pull.address, list(pending.hashes),
                                        list(pending.block_ids), follow=plan.pull.follow)
    finally:
        await runner.call(runner.engine.land_pull, pending, len(pulled.block_ids))
    return pulled


def unpulled(plan: ServePlan, pending: PendingPrefix | None) -> Pulled:
    """A planned pull that moved nothing: failed unless the blocks were here already."""
    if plan.pull is None:
        return Pulled.nothing()
    return Pulled.nothing(failed=pending is None or pending.start < pending.end_block)
