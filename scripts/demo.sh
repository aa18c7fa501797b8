#!/usr/bin/env bash
# Sets up the environment if needed, then runs the main demo: a decentralized RL run on this
# machine (a seed, a trainer with its validator, three inference workers, one of them cheating),
# printing a row per trainer step and what happened to the cheater. Extra args go to
# `hivenet simulate` instead (e.g. `--trainers 4 --outer-steps 10` for the DiLoCo run, or
# `--nodes 4 --duration 30` for a membership-only swarm).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
if [ "$#" -eq 0 ]; then
  set -- --rl --rl-steps 20 --workers 3 --cheat precision
fi
exec "$root/.venv/bin/hivenet" simulate "$@"
