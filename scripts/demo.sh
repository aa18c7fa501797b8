#!/usr/bin/env bash
# Sets up the environment if needed, then runs the main demo: a decentralized RL run on this
# machine (a seed, a trainer with its validator, three inference workers, one of them cheating)
# on a small Llama built here by `hivenet model init` (once; kept in the user cache), with
# transformers' native kernels under verification limits `hivenet calibrate` measured on it (once,
# kept beside it), printing a row per trainer step and what happened to the cheater.
#   bash scripts/demo.sh                 # the RL demo on the Llama
#   bash scripts/demo.sh --model tiny    # the same on TinyGPT; --model DIR: on a Hugging Face model
# Any other args go to `hivenet simulate` instead (e.g. `--trainers 4 --outer-steps 10` for the
# DiLoCo run, or `--nodes 4 --duration 30` for a membership-only swarm).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
hivenet="$root/.venv/bin/hivenet"
if [ "$#" -eq 0 ] || { [ "$#" -eq 2 ] && [ "$1" = "--model" ]; }; then
  model="${2:-}"
  if [ -z "$model" ]; then
    model="${HIVENET_DEMO_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/hivenet/demo-llama-micro}"
    if [ ! -f "$model/config.json" ]; then
      "$hivenet" model init "$model" --family llama --size micro
    fi
  fi
  set -- --rl --model "$model" --rl-steps 80 --workers 3 --cheat precision
  if [ "$model" != "tiny" ]; then
    policy="$model/verification-policy.json"
    if [ ! -f "$policy" ]; then
      "$hivenet" calibrate --model "$model" --dtype float32 --rollouts 256 --cheat-rollouts 16 --out "$policy"
    fi
    set -- "$@" --verification-policy "$policy"
  fi
fi
exec "$hivenet" simulate "$@"
