#!/usr/bin/env bash
# Run the test suite under another interpreter without installing bytegraph into it.
# Usage: scripts/test_elsewhere.sh [PYTHON] [pytest args...]   (no test path given: all of tests/)
# e.g. on the GPU machine (Python 3.12, torch 2.11): scripts/test_elsewhere.sh python3
# or locally with a 3.13 venv:                       scripts/test_elsewhere.sh /tmp/venv313/bin/python
#                                                    scripts/test_elsewhere.sh /tmp/venv313/bin/python tests/test_x.py -q
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
shift || true
paths=()
for arg in "$@"; do
    if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then paths+=("$arg"); fi
done
[[ ${#paths[@]} -gt 0 ]] || set -- tests "$@"
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
# Without pytest-xdist there (the GPU machine), one process: pyproject's addopts ask for -n.
"$PY" -c 'import xdist' 2>/dev/null || set -- -o addopts=-q "$@"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -p no:cacheprovider "$@"
