"""Over a pool: the prefix cache (hash -> block, the events the global index follows) and block
tables (sequences placed on the cache)."""
