"""The modeled engine: the agent's real engine with the model's forward priced by a profile (a YAML file
of one GPU's figures, each with its source) instead of computed. docs/memory.md#modeled-engine."""
