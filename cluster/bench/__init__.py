"""`radixmesh bench`: live clusters under one open-loop workload, one arm (routing policy, caching on or
off) after another, goodput and latency per offered rate, a JSON and a picture.

Self-contained on purpose: it reaches a cluster only through the launcher (`--local N`) and the
router's HTTP API, so the same folder measures an older checkout too.
"""
