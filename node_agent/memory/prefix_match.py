"""A sequence's prefix matched across the tiers at admission (as vLLM's KV cache coordinator's
`find_longest_cache_hit`): gpu hits first, then host or disk hits promoted to the gpu, and the
prompt's tokens by source the hit yields. NodeMemory asks for the hit and attaches it; which tier
each reused block comes from is decided only here."""

from dataclasses import dataclass

from radixmesh.node_agent.memory.sequence import SequenceBlocks
from radixmesh.node_agent.memory.tiers import HostTier, NoHostTier, TierMemory
from radixmesh.proto.block_hash import BlockHash
from radixmesh.proto.ids import BlockId
from radixmesh.proto.serve.tokens import TokenSources


@dataclass(slots=True)
class PrefixHit:
    """The pinned gpu blocks of a sequence's matched prefix, and how many of them were promoted
    from the host tier and from the disk tier (the rest were already in the gpu)."""

    block_ids: list[BlockId]
    host_blocks: int = 0
    disk_blocks: int = 0


def match_prefix(gpu: TierMemory, host: HostTier | NoHostTier, hashes: list[BlockHash]) -> PrefixHit:
    """Pinned gpu blocks of the longest prefix of `hashes` the tiers hold: gpu hits, then host (or,
    through the host, disk) hits promoted to the gpu, alternating while either advances."""
    hit = PrefixHit([])
    while len(hit.block_ids) < len(hashes):
        got = gpu.cache.match(hashes[len(hit.block_ids):])
        if not got:
            promoted = host.promote(gpu, hashes, len(hit.block_ids))
            got = promoted.block_ids
            hit.disk_blocks += promoted.from_disk
            hit.host_blocks += len(got) - promoted.from_disk
        if not got:
            break
        hit.block_ids += got
    return hit


def count_sources(seq: SequenceBlocks, hit: PrefixHit, num_blocks: int, block_size: int) -> None:
    """The request's prompt tokens by source, set once (at its first admission): of its `num_blocks`
    cached blocks, those promoted from host or disk, those pulled or adopted (external), and the
    rest found in the gpu tier."""
    if seq.stats.sources is not None:
        return
    external = sum(1 for h in seq.table.hashes[:num_blocks] if h in seq.external_hashes)
    local_gpu = num_blocks - hit.host_blocks - hit.disk_blocks - external
    seq.stats.sources = TokenSources.of_prompt(
        seq.stats.prompt_tokens, local_gpu=local_gpu * block_size, local_host=hit.host_blocks * block_size,
        local_disk=hit.disk_blocks * block_size, remote=external * block_size)
