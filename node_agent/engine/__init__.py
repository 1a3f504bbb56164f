"""The node engine: continuous batching over the paged KV memory, preemption, and its thread."""
