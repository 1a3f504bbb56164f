"""Traces, the trace simulator over the production index and policies, replay and the demo workload."""
