"""The sshd box fixtures work with real connections through paramiko."""

from __future__ import annotations

import os
import pathlib
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import paramiko
import pytest
from paramiko.ssh_exception import NoValidConnectionsError

from tests import sshd_boxes
from tests.sshd_boxes import ClientKey, SshdBox, free_port, start_box, write_known_hosts

# fixtures come from tests/conftest.py

TIMEOUT = 30.0  # seconds, for every network step (generous: a busy machine is slow, not broken)


def connect(
    box: SshdBox, key: ClientKey, known_hosts: pathlib.Path, user: str = "root"
) -> paramiko.SSHClient:
    """Connect strictly: only keys in ``known_hosts`` are accepted."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            "127.0.0.1",
            port=box.port,
            username=user,
            key_filename=str(key.private_key),
            allow_agent=False,
            look_for_keys=False,
            timeout=TIMEOUT,
            banner_timeout=TIMEOUT,
            auth_timeout=TIMEOUT,
        )
    except BaseException:
        client.close()
        raise
    return client


def run(client: paramiko.SSHClient, command: str) -> tuple[int, str]:
    """Run ``command``; return (exit status, stdout)."""
    _stdin, stdout, _stderr = client.exec_command(command, timeout=TIMEOUT)
    out = stdout.read().decode()
    return stdout.channel.recv_exit_status(), out


@pytest.mark.parametrize("index", range(3))
def test_pool_box_runs_command_as_root(sshd_pool, ssh_client_key, ssh_known_hosts, index):
    box = sshd_pool[index]
    assert box.alive()
    assert box.name == f"box{index}"
    assert box.known_hosts_line() in ssh_known_hosts.read_text().splitlines()
    client = connect(box, ssh_client_key, ssh_known_hosts)
    try:
        assert run(client, "echo hi") == (0, "hi\n")
    finally:
        client.close()


def test_pool_boxes_are_distinct(sshd_pool):
    assert len({box.port for box in sshd_pool}) == 3
    assert len({box.host_key_pub for box in sshd_pool}) == 3
    assert len({box.directory for box in sshd_pool}) == 3
    for box in sshd_pool:
        assert box.host_key_pub.startswith("ssh-ed25519 AAAA")
        assert len(box.host_key_pub.split()) == 2
        assert (box.directory / "sshd_config").is_file()
        assert box.known_hosts_line() == f"[127.0.0.1]:{box.port} {box.host_key_pub}"


def test_client_key_file(ssh_client_key):
    assert ssh_client_key.private_key.stat().st_mode & 0o777 == 0o600
    assert ssh_client_key.public_line.startswith("ssh-ed25519 AAAA")
    pub = ssh_client_key.private_key.with_name(ssh_client_key.private_key.name + ".pub")
    assert pub.read_text().strip() == ssh_client_key.public_line
    paramiko.Ed25519Key.from_private_key_file(str(ssh_client_key.private_key))


def test_sftp_put_and_stat(sshd_pool, ssh_client_key, ssh_known_hosts, tmp_path):
    local = tmp_path / "payload.bin"
    payload = os.urandom(50_000)
    local.write_bytes(payload)
    remote = tmp_path / "uploaded.bin"  # the box shares this machine's files
    client = connect(sshd_pool[1], ssh_client_key, ssh_known_hosts)
    try:
        sftp = client.open_sftp()
        sftp.put(str(local), str(remote))
        assert sftp.stat(str(remote)).st_size == len(payload)
        with sftp.open(str(remote), "rb") as f:
            assert f.read() == payload
        sftp.close()
    finally:
        client.close()
    assert remote.read_bytes() == payload


def test_unknown_host_is_refused(sshd_factory, ssh_client_key, ssh_known_hosts):
    stranger = sshd_factory("stranger")
    with pytest.raises(paramiko.SSHException, match="known_hosts") as info:
        connect(stranger, ssh_client_key, ssh_known_hosts)
    assert not isinstance(info.value, paramiko.BadHostKeyException)


def test_wrong_host_key_is_refused(sshd_pool, ssh_client_key, tmp_path):
    target, impostor = sshd_pool[0], sshd_pool[1]
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{target.port} {impostor.host_key_pub}\n")
    with pytest.raises(paramiko.BadHostKeyException):
        connect(target, ssh_client_key, known_hosts)


def test_unauthorized_key_is_refused(sshd_pool, ssh_known_hosts, tmp_path):
    other_key = sshd_boxes.make_client_key(tmp_path)
    with pytest.raises(paramiko.AuthenticationException):
        connect(sshd_pool[2], other_key, ssh_known_hosts)


def test_stop_cuts_sessions_and_refuses_connections(sshd_factory, ssh_client_key, tmp_path):
    box = sshd_factory("doomed")
    known_hosts = write_known_hosts(tmp_path / "known_hosts", [box])
    client = connect(box, ssh_client_key, known_hosts)
    try:
        sftp = client.open_sftp()
        assert run(client, "echo alive") == (0, "alive\n")
        # A long-running command in a session of its own must die with the box.
        _in, sleeper_out, _err = client.exec_command("echo $$; exec sleep 300")
        sleeper_pid = int(sleeper_out.readline())
        listener_pid = box.process.pid

        started = time.monotonic()
        box.stop()
        # SIGKILL, not a polite wait: far less than the STOP_TIMEOUT a wait would run out.
        assert time.monotonic() - started < sshd_boxes.STOP_TIMEOUT

        assert not box.alive()
        assert box.process.returncode is not None
        assert not _running(listener_pid)
        assert not _running(sleeper_pid)
        with pytest.raises((OSError, EOFError, paramiko.SSHException)):
            sftp.stat("/")
    finally:
        client.close()
    with pytest.raises((NoValidConnectionsError, OSError)):
        connect(box, ssh_client_key, known_hosts)
    box.stop()  # idempotent
    assert not box.alive()


def test_free_port_has_no_listener():
    port = free_port()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT).close()


def test_restart_with_same_host_key(sshd_factory, ssh_client_key, tmp_path):
    first = sshd_factory("first")
    key_file = first.directory / "ssh_host_ed25519_key"
    first.stop()
    second = sshd_factory("second", host_key=key_file)
    assert second.host_key_pub == first.host_key_pub
    known_hosts = write_known_hosts(tmp_path / "known_hosts", [second])
    client = connect(second, ssh_client_key, known_hosts)
    client.close()


def test_taken_port_is_retried(tmp_path, ssh_client_key, monkeypatch):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        real_free_port = sshd_boxes.free_port
        monkeypatch.setattr(sshd_boxes, "free_port", lambda: next(ports, None) or real_free_port())
        box = start_box(tmp_path, "retry", authorized={"root": ssh_client_key})
        try:
            assert box.port != taken
            assert box.alive()
            assert "Address already in use" not in (box.directory / "sshd.log").read_text()
        finally:
            box.stop()


def test_many_simultaneous_connections(sshd_pool, ssh_client_key, ssh_known_hosts):
    def one(i: int) -> str:
        client = connect(sshd_pool[i % 3], ssh_client_key, ssh_known_hosts)
        try:
            return run(client, f"echo {i}")[1]
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=12) as pool:
        assert list(pool.map(one, range(12))) == [f"{i}\n" for i in range(12)]


@pytest.fixture
def linux_user(login_user):
    """The name of a fresh unlocked Linux user (tests/conftest.py login_user)."""
    return login_user.pw_name


def test_non_root_user_can_log_in(linux_user, sshd_factory, ssh_client_key, tmp_path):
    box = sshd_factory("userbox", authorized={linux_user: ssh_client_key})
    known_hosts = write_known_hosts(tmp_path / "known_hosts", [box])
    try:
        client = connect(box, ssh_client_key, known_hosts, user=linux_user)
        try:
            assert run(client, "id -un") == (0, f"{linux_user}\n")
            assert run(client, "echo $HOME") == (0, f"/home/{linux_user}\n")
        finally:
            client.close()
    finally:
        box.stop()  # no session may outlive the test: userdel refuses busy users


def test_authorize_adds_user_to_running_box(linux_user, sshd_factory, ssh_client_key, tmp_path):
    box = sshd_factory("later")
    known_hosts = write_known_hosts(tmp_path / "known_hosts", [box])
    try:
        with pytest.raises(paramiko.AuthenticationException):
            connect(box, ssh_client_key, known_hosts, user=linux_user)
        box.authorize(linux_user, ssh_client_key)
        box.authorize(linux_user, ssh_client_key)  # twice is harmless
        lines = (box.directory / "authorized_keys" / linux_user).read_text().splitlines()
        assert lines == [ssh_client_key.public_line]
        client = connect(box, ssh_client_key, known_hosts, user=linux_user)
        assert run(client, "id -un") == (0, f"{linux_user}\n")
        client.close()
    finally:
        box.stop()


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"
