#!/usr/bin/env bash
# Install what the tests need (Debian's openssh-server included) and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
# Runner tests start agents as real unprivileged users, who must be able to reach the runner
# and the fake agents in this checkout: a clone made in a 0700 directory (mktemp -d) would
# fail them for a reason that has nothing to do with the code.
if [ "$(id -u)" = 0 ]; then chmod go+rx . ; fi
exec .venv/bin/python -m pytest -q "$@"
