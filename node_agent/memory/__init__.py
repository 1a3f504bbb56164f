"""Node memory over common's block pool and prefix cache: node_memory.py (NodeMemory, the scheduler's
block space and the agent's one handle, with its config.py), tiers.py (a node's gpu and host tiers and
the moves between them), disk/ (the disk tier), zones/ (how the gpu pool is split), physical.py (what
the process and device hold), metrics.py (a tier's snapshot), sequence.py (what memory sees of a
sequence)."""
