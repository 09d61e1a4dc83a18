"""useradd/groupadd failures are told apart by exit status and a probe, never by their words.

The account program's message is in the host's language, so the kind of a failure (``permission``:
this login may not change the account files; ``failed``: anything else) comes from the exit
status and whether the account file can be written (``os.access``, false on a read-only mount even
for root). Each case runs a real program that prints a message and exits with a status, against a
real file on a real (read-only or writable) mount.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetctl.host.accounts import admin_failure_kind, run_admin
from fleetctl.host.wire import Stop
from tests.host.test_host_safety import mounts  # noqa: F401 - fixture


def _fail(message: str, status: int) -> list[str]:
    return ["sh", "-c", 'printf "%s\\n" "$1" >&2; exit "$2"', "sh", message, str(status)]


@pytest.fixture
def read_only_file(tmp_path: Path, mounts):  # noqa: F811 - the fixture above
    """A file on a read-only tmpfs: not writable, whoever asks (root included)."""
    point = tmp_path / "ro"
    point.mkdir()
    mounts.tmpfs(point)
    (point / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
    return point / "passwd"


def _kind(argv: list[str], path: Path) -> str:
    with pytest.raises(Stop) as caught:
        run_admin(argv, "creating user x", str(path))
    return caught.value.event["kind"]


def test_a_refusal_in_german_on_an_unwritable_file_is_a_permission_error(read_only_file):
    # Before: "failed", since the message does not hold the English word.
    assert _kind(_fail("useradd: Keine Berechtigung", 1), read_only_file) == "permission"


def test_the_english_word_on_a_writable_file_is_not_a_permission_error(tmp_path):
    # Before: "permission", because the message said so; the file could be written.
    path = tmp_path / "passwd"
    path.write_text("")
    assert _kind(_fail("useradd: Permission denied (lock held?)", 1), path) == "failed"


def test_a_status_that_is_not_about_the_account_files_is_failed(read_only_file):
    # 9: the user name is in use; nothing to do with who may write /etc/passwd.
    assert _kind(_fail("useradd: user 'x' already exists", 9), read_only_file) == "failed"


def test_the_message_is_quoted_in_the_error(tmp_path):
    path = tmp_path / "group"
    path.write_text("")
    with pytest.raises(Stop) as caught:
        run_admin(_fail("groupadd: nicht möglich", 10), "creating group g", str(path))
    assert "exited with status 10: groupadd: nicht möglich" in caught.value.event["message"]


@pytest.mark.parametrize("status,writable,kind", [
    (1, False, "permission"), (10, False, "permission"), (1, True, "failed"),
    (10, True, "failed"), (9, False, "failed"), (12, False, "failed")])
def test_the_kind_table(status: int, writable: bool, kind: str):
    assert admin_failure_kind(status, writable) == kind
