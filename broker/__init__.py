"""The cluster broker: the agent's only path to the cluster (see DESIGN.md, trust boundaries)."""
