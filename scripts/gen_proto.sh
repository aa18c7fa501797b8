#!/usr/bin/env bash
# Regenerates protocol/*_pb2.py from protocol/*.proto (the generated files are committed).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
.venv/bin/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. protocol/*.proto
