#!/usr/bin/env bash
# Sets up the environment if needed, then runs the main demo: a local swarm on this machine.
# Extra args go to `hivenet simulate` (default: a seed and 4 nodes for 20 seconds).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
if [ "$#" -eq 0 ]; then
  set -- --nodes 4 --roles validator,relay --duration 20
fi
exec "$root/.venv/bin/hivenet" simulate "$@"
