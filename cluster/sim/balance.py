"""What load balance alone allows on a trace: the busiest node's prompt tokens over the mean, for
requests placed with no regard to cache, online and offline.

- online: each request, in arrival order, to the node with the least tokens so far (greedy list
  scheduling, Graham 1966), which knows nothing of the requests still to come;
- offline: the largest requests first, each to the least loaded node (LPT): the whole trace known
  in advance, which no router has.

A cache-aware policy also keeps requests with their prefix, so it balances no better than the
online figure unless it holds back room it cannot know it will need.
"""

import heapq
from collections.abc import Sequence


def online_max_over_mean(tokens: Sequence[int], nodes: int) -> float:
    """Busiest node / mean when each request goes to the least loaded node as it arrives."""
    return _greedy(tokens, nodes)


def offline_max_over_mean(tokens: Sequence[int], nodes: int) -> float:
    """Busiest node / mean when the largest requests are placed first (LPT)."""
    return _greedy(sorted(tokens, reverse=True), nodes)


def _greedy(tokens: Sequence[int], nodes: int) -> float:
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    total = sum(tokens)
    if not total:
        return 0.0
    # (load, node): ties go to the lowest node number, so the result is deterministic.
    heap = [(0, k) for k in range(nodes)]
    for t in tokens:
        load, k = heapq.heappop(heap)
        heapq.heappush(heap, (load + t, k))
    return max(load for load, _ in heap) / (total / nodes)
