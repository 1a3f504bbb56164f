"""What the router asks of an agent and what comes back: plans, sampling, tokens by source, limits."""
