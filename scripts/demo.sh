#!/usr/bin/env bash
# Install fleetctl and run the main job on the demo inventory (inventory/demo.yaml): two local
# boxes under .demo/, directories on this machine that act as hosts; no SSH needed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 2
fleetctl() { .venv/bin/fleetctl "$@"; }
# The grants' secrets (demo values) come from the environment, as the inventory says.
. scripts/demo-secrets.sh
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

step "8. each agent's credentials: beside the releases, 0700/0600, never in a release"
ls -l .demo/alpha/credentials/engineer
grep -rl "$DEMO_FORGE_TOKEN_ENGINEER" .demo/alpha/releases || echo "no secret in any release"

step "9. the forge token of the engineer is rotated: drift shows a digest change, never the value"
export DEMO_FORGE_TOKEN_ENGINEER=demo-forge-engineer-rotated-44c2
fleetctl drift alpha; expect $? 1 "drift found"
fleetctl ship --yes alpha; expect $? 0 "shipped"

step "10. the least-privilege audit: the demo agents share your user (no Linux user of their own)"
fleetctl creds audit; expect $? 1 "findings"

step "releases on alpha (current -> $(readlink .demo/alpha/current))"
ls .demo/alpha/releases
echo
echo "demo: all steps behaved as expected"
