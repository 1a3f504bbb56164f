"""The node's memory zones (weights, activations, running KV, prefix cache): their budget, the
policies that cap the pool's kv and prefix zones, the governor that applies them, their metrics."""
