#!/usr/bin/env bash
# Install fleetctl into .venv (Python >= 3.11). With --test, also pytest and Debian's
# openssh-server (the test suite starts real sshd boxes on 127.0.0.1), git, and chromium (the
# HTML report is checked in headless Chromium: tests/test_report_html.py).
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
