"""The block pool of one tier: blocks free (free runs), in use (refcounts) or cached (an eviction
order: LRU or S3-FIFO), its config, hooks and counters."""
