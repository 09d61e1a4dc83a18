#!/usr/bin/env bash
# Install fleetctl and run the main job on the demo inventory (inventory/demo.yaml): two local
# boxes under .demo/, directories on this machine that act as hosts; no SSH needed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 2
fleetctl() { .venv/bin/fleetctl "$@"; }
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
expect() {  # expect CODE WHAT: check the last exit code
  if [ "$1" != "$2" ]; then echo "demo: expected exit $2 ($3), got $1" >&2; exit 1; fi
  echo "-> exit $1 ($3)"
}

rm -rf .demo
step "1. ship the blueprint to the demo boxes alpha and beta (a new release on each)"
fleetctl ship --yes; expect $? 0 "shipped"

step "2. drift right after: each box equals the blueprint"
fleetctl drift; expect $? 0 "in sync"

step "3. someone hand-patches runner/README.md on alpha"
echo "hotfix made on the box" >> .demo/alpha/current/runner/README.md
echo "appended a line to .demo/alpha/current/runner/README.md"

step "4. drift finds it, origin hand-patch (the box is ahead of the blueprint)"
fleetctl drift; expect $? 1 "drift found"

step "5. ship refuses to regress the hand-patch; nothing is written"
fleetctl ship --yes; expect $? 3 "refused"

step "6. ship --force overwrites it on purpose (a new release, switched atomically)"
fleetctl ship --yes --force; expect $? 0 "shipped"

step "7. drift is clean again"
fleetctl drift; expect $? 0 "in sync"

step "releases on alpha (current -> $(readlink .demo/alpha/current))"
ls .demo/alpha/releases
echo
echo "demo: all steps behaved as expected"
