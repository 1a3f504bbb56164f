"""External engines (vLLM, SGLang) as nodes of the cluster: their KV events into the global index."""
