"""Fixtures for the transport tests: real sudoers drop-in files."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def sudoers():
    """``write(*lines)`` puts the lines in /etc/sudoers.d/fleetctl-test-<random> (0440, checked
    by ``visudo -cf``; written again on each call); the file is removed when the test ends."""
    path = Path("/etc/sudoers.d") / f"fleetctl-test-{secrets.token_hex(6)}"

    def write(*lines: str) -> Path:
        path.write_text("".join(line + "\n" for line in lines))
        os.chmod(path, 0o440)
        check = subprocess.run(["visudo", "-cf", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        return path

    try:
        yield write
    finally:
        path.unlink(missing_ok=True)
