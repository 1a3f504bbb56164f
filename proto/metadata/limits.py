"""Sizes the metadata service accepts by default, shared with the clients that must stay within them
(the router's Match queries, the agents' heartbeats)."""

MAX_HASHES_PER_QUERY = 8192
"""Block hashes in one Match query (8192 blocks of 16 tokens = 128k tokens)."""
MAX_HITS_PER_HEARTBEAT = 4096
"""Finished requests' hit reports in one heartbeat."""
