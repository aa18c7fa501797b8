"""The `hivenet` command line: thin click commands that build a config and run node code.

- `main`: the `hivenet` group and `main()` entry point.
- `node_commands`: `identity`, `join`, `seed`, `simulate`.
- `swarm_queries`: `peers`, `doctor`, and the throwaway client node they and `dashboard` use.
- `doctor`: the checks behind `hivenet doctor`.
- `simulate`: the live view behind `hivenet simulate`.
- `weights`: `hivenet weights publish|fetch|status`.
- `errors`: `friendly_errors`, which turns `HivenetError` into a clean message and exit code.
"""
