"""Thin MCP adapters over the control plane (broker, metrics, traces, gate)."""
