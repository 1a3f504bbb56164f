"""Node memory: the block pool, the prefix cache over it, block tables, and their metrics."""
