"""One node of the cluster: the agent, its Ray actor shell, and the memory, engine, model and transfer plane it owns."""
