"""Sizes the metadata service accepts by default, shared with the clients that must stay within them
(the router's Match queries, the agents' heartbeats), and the shape of the names it keys state by."""

import re

MAX_HASHES_PER_QUERY = 8192
"""Block hashes in one Match query (8192 blocks of 16 tokens = 128k tokens)."""
MAX_HITS_PER_HEARTBEAT = 4096
"""Finished requests' hit reports in one heartbeat."""
MAX_TENANT_CHARS = 256
"""A tenant name (`cache_salt`, `user`): long enough for any id, short enough that a heartbeat of
MAX_HITS_PER_HEARTBEAT reports stays far below the 16 MiB message limit."""
MAX_REQUEST_ID_CHARS = 128
MAX_LAYOUT_CHARS = 256
MAX_ADDRESS_CHARS = 256
MAX_PEERS_PER_LOAD = 1024
"""Peers a heartbeat may report a pull bandwidth for."""
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""1-64 characters, safe in gRPC metadata, Ray actor names, metric labels and log lines."""


def check_node_id(node: str) -> None:
    """ValueError unless `node` is a valid node id (1-64 of A-Z a-z 0-9 . _ -, not starting with . _ -)."""
    if not isinstance(node, str) or _NODE_ID.fullmatch(node) is None:
        raise ValueError(f"node id must be 1-64 characters of A-Z a-z 0-9 . _ - (starting with a letter "
                         f"or digit), got {str(node)[:80]!r}")


def check_text(what: str, value: str, limit: int) -> None:
    """ValueError when `value` is longer than `limit` characters."""
    if len(value) > limit:
        raise ValueError(f"{what} is at most {limit} characters, got {len(value)}")
