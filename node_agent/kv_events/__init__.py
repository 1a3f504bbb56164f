"""The agent's cache events, spoken outward in vLLM's ZMQ format (opt-in: AgentConfig.kv_events_endpoint)."""
