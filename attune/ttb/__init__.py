"""TrainingThroughputBench (TTB): the protocol, the workload, entries, their verifier and the leaderboard page."""
