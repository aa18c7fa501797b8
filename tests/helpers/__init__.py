"""Helpers shared by tests and benchmarks (never shipped in the hivenet packages)."""
