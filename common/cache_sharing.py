"""How the nodes of a deployment share their caches unless told otherwise: hand-off and recall (the
cluster's ghost). The agents (AgentConfig), the launcher (LauncherConfig) and the simulator (SimConfig)
all read these, so `radixmesh sim` runs what `radixmesh up` runs. They live here rather than in
node_agent.config because that module loads torch with the engine, and the simulator needs none."""

DEFAULT_HANDOFF = False
"""AgentConfig.handoff: off until measured on real traffic (the simulator's best row uses it)."""

DEFAULT_RECALL_BLOCKS = 65536
"""AgentConfig.recall_blocks: the ghost hashes each agent remembers; recall is on while this is > 0."""
