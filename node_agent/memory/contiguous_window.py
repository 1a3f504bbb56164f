"""Where a contiguous allocation that no free run fits is carved: the window that evicts the fewest."""

from radixmesh.node_agent.memory.eviction import EvictionOrder


def cheapest_window(ref: list[int], cached: EvictionOrder, n: int) -> int | None:
    """Start of the run of n consecutive blocks, none in use (ref > 0), holding the fewest `cached`
    blocks (the lowest such start); None when no such run exists. One pass, O(len(ref)): it only
    runs when no free run fits, so the scan is paid rarely."""
    best_start, best_cost = None, n + 1
    streak = cost = 0
    for b in range(len(ref)):
        if ref[b]:
            streak = cost = 0
            continue
        streak += 1
        cost += b in cached
        if streak > n:
            cost -= (b - n) in cached
        if streak >= n and cost < best_cost:
            best_start, best_cost = b - n + 1, cost
    return best_start
