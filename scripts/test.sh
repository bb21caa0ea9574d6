#!/usr/bin/env bash
# Run the template's whole test suite on a fresh machine with only Python 3 (>= 3.11):
# creates .venv/ beside this folder, installs what the tests need, and runs pytest.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the quick tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements-test.txt
exec .venv/bin/python -m pytest "$@"
