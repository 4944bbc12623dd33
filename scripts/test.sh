#!/usr/bin/env bash
# Set up a virtual environment with the pinned CI requirements and run the default test suite (no `slow` tests).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -r requirements-ci.txt
python -m pip install -q --no-deps -e .
python -m pytest -q "$@"
