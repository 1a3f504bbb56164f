"""radixmesh.kernels: the node agent's compute over the paged KV cache.

KV layout (radixmesh.proto.kv_layout): one tensor per tier ``[num_blocks, layers, 2, block_size,
kv_heads, head_dim]``; attention and `write_kv` take per-layer views ``cache_k = kv[:, layer, 0]``,
``cache_v = kv[:, layer, 1]`` (``[num_blocks, block_size, kv_heads, head_dim]``, strided), while
`gather_blocks` / `scatter_blocks` move whole blocks across all layers. Block tables are int32
``[B, max_blocks]`` whose entries past a sequence's blocks are never read; lengths are int32.

Decode attention is planned once per forward: `plan_decode` validates the batch's tables and lengths
and prepares what the implementation reads (the torch reference's gather rows and mask), and every
layer's `paged_decode_attention` reads that plan.

Each entry point (`radixmesh.kernels.ops`) validates its arguments (ValueError, nothing written) and then runs the
implementation `dispatch.select` picks: Triton on CUDA, the torch reference otherwise,
``RADIXMESH_KERNELS=torch|triton`` to force one.
"""

from radixmesh.import_name import step_aside

step_aside(__name__)  # importable only as radixmesh.kernels (radixmesh/import_name.py)
