"""Node memory over common's block pool and prefix cache: zones/ (how the gpu pool is split), tiers.py
(a node's gpu and host tiers and the moves between them), disk/ (the disk tier), physical.py (what
the process and device hold), metrics.py (a tier's snapshot).
The engine's PagedMemory composes the tiers for its scheduler."""
