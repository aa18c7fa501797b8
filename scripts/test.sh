#!/usr/bin/env bash
# Sets up the environment if needed, then runs the test suite. Extra args go to pytest
# (e.g. `scripts/test.sh -m slow` for the long tests).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
