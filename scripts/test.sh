#!/usr/bin/env bash
# Sets up the environment if needed, then runs the test suite, or one tier of it:
#   scripts/test.sh               unit + integration: the loop to run after every change
#   scripts/test.sh unit          the unit tier alone (no processes, sockets or sleeps; seconds)
#   scripts/test.sh integration   real nodes on 127.0.0.1
#   scripts/test.sh e2e           the README's commands as written, as separate processes
#   scripts/test.sh slow          the long tests of every tier (marked `slow`), but the network stage
#   scripts/test.sh network       nodes on separate hosts in network namespaces (root; tests/integration/network)
#   scripts/test.sh all           every test
# Further arguments go to pytest (`scripts/test.sh unit -k toploc`, `scripts/test.sh -x`); a path
# among them runs that path instead of the tier's directories.
# Tiers run in parallel (pytest-xdist) on HIVENET_TEST_WORKERS processes (default: the unit
# tier on one per core, the others on twice that, since their tests mostly wait on the network);
# HIVENET_TEST_WORKERS=0 runs in this process, serially.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"

tier="default"
case "${1:-}" in
  unit|integration|e2e|slow|network|all|default) tier="$1"; shift ;;
esac

cores="$(nproc 2>/dev/null || echo 2)"
case "$tier" in
  unit)        paths=(tests/unit);                   marks="not slow"; workers=$cores ;;
  integration) paths=(tests/integration);            marks="not slow"; workers=$((2 * cores)) ;;
  default)     paths=(tests/unit tests/integration); marks="not slow"; workers=$((2 * cores)) ;;
  e2e)         paths=(tests/e2e);                    marks="not slow"; workers=$((2 * cores)) ;;
  slow)        paths=(tests --ignore=tests/integration/network); marks="slow"; workers=$cores ;;
  network)     paths=(tests/integration/network);    marks="slow";     workers=$cores ;;
  all)         paths=(tests);                        marks="";         workers=$((2 * cores)) ;;
esac
for arg in "$@"; do  # a path or node id given on the command line replaces the tier's paths
  if [ -e "${arg%%::*}" ]; then paths=(); break; fi
done
workers="${HIVENET_TEST_WORKERS:-$workers}"
parallel=()
if [ "$workers" -gt 0 ]; then
  # --dist loadfile: a module's tests share their module-scoped swarm on one worker
  parallel=(-n "$workers" --dist loadfile)
fi
exec "$root/.venv/bin/python" -m pytest -m "$marks" ${parallel[@]+"${parallel[@]}"} ${paths[@]+"${paths[@]}"} "$@"
