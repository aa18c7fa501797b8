"""Helpers shared by tests and benchmarks: fake workers, trainer harnesses, test swarms. Never shipped."""
