"""attune: agentic throughput tuning for LLM training recipes, with a correctness gate."""

__version__ = "0.1.0"
