"""Helpers shared by the tests and benchmarks (never imported by the shipped packages).

- `trainers`: `tiny_config`, `averager_swarm`, `harness` / `Harness` (loopback DiLoCo trainers).
"""
