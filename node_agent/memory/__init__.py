"""Node memory, one package: pool/ (the block pool of a tier), cache/ (prefix cache and block tables
over it), zones/ (how the gpu pool is split), tiers.py (a node's gpu and host tiers and the moves
between them), physical.py (what the process and device hold), metrics.py (a tier's snapshot).
The engine's PagedMemory composes the tiers for its scheduler."""
