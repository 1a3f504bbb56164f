"""The KV transfer plane: pulling prefix blocks from peers and serving them, over UCX or Ray."""
