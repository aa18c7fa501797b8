#!/usr/bin/env bash
# Sets up the environment if needed, then runs the main demo: a DiLoCo training run of four
# trainers on this machine, printing the loss per outer step. Extra args go to
# `hivenet simulate` instead (e.g. `--nodes 4 --duration 30` for a membership-only swarm).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
if [ "$#" -eq 0 ]; then
  set -- --trainers 4 --outer-steps 10 --inner-steps 50
fi
exec "$root/.venv/bin/hivenet" simulate "$@"
