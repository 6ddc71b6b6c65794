"""Readers of untrusted input: bounded JSON/YAML, training logs (one parser per framework) and
profiler traces. They depend only on the core."""
