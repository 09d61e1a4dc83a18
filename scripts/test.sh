#!/usr/bin/env bash
# Install what the tests need (Debian's openssh-server included) and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest -q "$@"
