#!/usr/bin/env bash
# Install fleetctl into .venv (Python >= 3.11). With --test, also pytest and Debian's
# openssh-server (the test suite starts real sshd boxes on 127.0.0.1), git, sudo (the
# `become: sudo` tests log in as a non-root user whose sudoers entry they write), chromium (the
# HTML report is checked in headless Chromium: tests/commands/test_report_html.py), and the real
# Claude Code from the npm registry into .tools/ (gitignored): the harness-probe tests run it
# against a local endpoint (docs/tokens.md, *Harness profiles*). Needs node >= 18 and npm.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: fleetctl needs Python >= 3.11 ($python is $("$python" --version 2>&1))" >&2
  exit 2
fi

if [ "${1:-}" = "--test" ]; then
  need=()
  [ -x /usr/sbin/sshd ] || need+=(openssh-server)
  command -v git >/dev/null || need+=(git)
  command -v ssh-keygen >/dev/null || need+=(openssh-client)
  [ -x /usr/bin/sudo ] || need+=(sudo)
  command -v chromium >/dev/null || need+=(chromium)
  if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
      echo "setup: the tests need ${need[*]} (Debian packages) and run as root" >&2
      exit 2
    fi
    # Keep the package from starting a system sshd: the tests start their own.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
      chmod +x /usr/sbin/policy-rc.d
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  mkdir -p /run/sshd && chmod 0755 /run/sshd
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
if [ "${1:-}" = "--test" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
else
  .venv/bin/python -m pip install -q --disable-pip-version-check -e .
fi

if [ "${1:-}" = "--test" ]; then
  # The version the blueprint's harness profiles were probed with (blueprint/harnesses/).
  claude_code_version=${CLAUDE_CODE_VERSION:-2.1.197}
  claude=.tools/node_modules/.bin/claude
  if ! "$claude" --version 2>/dev/null | grep -q "^$claude_code_version "; then
    if ! command -v npm >/dev/null; then
      echo "setup: the harness tests need npm (node >= 18) to install @anthropic-ai/claude-code" >&2
      exit 2
    fi
    mkdir -p .tools
    npm install --prefix .tools --no-audit --no-fund --no-save --loglevel=error \
      "@anthropic-ai/claude-code@$claude_code_version" >/dev/null
    # npm >= 11 may skip the package's postinstall (it copies the native binary into place).
    "$claude" --version >/dev/null 2>&1 || \
      node .tools/node_modules/@anthropic-ai/claude-code/install.cjs >/dev/null
    "$claude" --version >/dev/null
  fi
  # The runner's gate tests run real checkers (tests/runner/test_runner_gates.py): ruff and mypy in the
  # venv, tsc in a project-local node directory (node and npm come with the machine). Pinned:
  # the tests compare their messages. tests/test_codebase.py runs ruff, mypy (with the stubs
  # below) and import-linter's lint-imports over fleetctl itself (pyproject.toml).
  .venv/bin/python -m pip install -q --disable-pip-version-check ruff==0.17.6 mypy==2.4.1 \
    import-linter==2.16 types-PyYAML==6.0.12.20261122 types-paramiko==5.1.0.20261030 \
    types-jsonschema==4.26.0.20261006
  # tests/host/test_host_inprocess.py: the host program (fleetctl/host, fleetctl/protocol.py) must run
  # on the oldest python3 a host may have (3.8); vermin reads the minimum version off the code.
  .venv/bin/python -m pip install -q --disable-pip-version-check vermin==1.9.2
  if [ ! -x .tools/node/node_modules/.bin/tsc ] \
      || [ "$(.tools/node/node_modules/.bin/tsc -v)" != "Version 5.9.3" ]; then
    if ! command -v npm >/dev/null; then
      echo "setup: the runner's gate tests need npm (to install typescript into .tools/node)" >&2
      exit 2
    fi
    mkdir -p .tools/node
    # --prefix: without it npm takes .tools (which has node_modules) for the project and its
    # install prunes the Claude Code installed there above.
    npm install --prefix .tools/node --no-audit --no-fund --silent typescript@5.9.3 >/dev/null
  fi
fi
