"""The environment matrix's boxes are what they claim (tests/hostenv.py), and what a login's
environment does to a session: start-up noise, a missing interpreter, an error written last, a
connection that drops."""

from __future__ import annotations

import json
import os
import threading

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.hostenv import MATRIX, NOISE_RC, SYSTEM_PYTHON, variant

PROBE = 'umask; echo "lang=$LANG"; echo "tmp=$TMPDIR"; command -v python3 || echo no-python3'


@pytest.mark.parametrize("env", MATRIX, ids=str)
def test_each_box_of_the_matrix_has_the_environment_it_names(env, env_hosts):
    host = env_hosts(env)
    seen = host.run(PROBE)
    assert seen.returncode == 0, seen.stderr
    out = seen.stdout.decode()
    umask = {"umask-077": "0077", "umask-027": "0027", "umask-002": "0002",
             "sshd-umask-077": "0077"}.get(env.name, "0022")
    if env.name == "noisy-rc":
        assert out.startswith("Welcome to this box") and "no newline at the end0022\n" in out
        assert b"a warning from .bashrc on stderr" in seen.stderr
    elif env.locale is not None or env.name == "locale-de-missing":
        assert "lang=de_DE." in out
        # bash itself cannot switch to it (LOCPATH is read by its children only): it says so
        # on stderr, in every session, as such a host does.
        assert b"de_DE" in seen.stderr
    else:
        assert f"\n{umask}\n" in "\n" + out, out
        assert seen.stderr == b""
    if env.locale is not None:  # Python under that locale reads names as latin-1
        enc = host.run("python3 -c 'import sys; print(sys.getfilesystemencoding())'")
        assert enc.stdout.decode().split() == ["iso8859-1"]
    assert ("no-python3" in out) == env.python_elsewhere
    if env.name == "sudo-french":  # the login's sudo speaks French: no English to read
        said = host.run("LC_ALL=C sudo -n true")
        assert said.returncode == 1 and "mot de passe" in said.stderr.decode(), said
    if env.noexec_tmp:
        tmp = out.split("tmp=", 1)[1].splitlines()[0]
        assert "noexec" in next(line for line in open("/proc/self/mounts")
                                if line.split()[1] == tmp).split()[3]
        assert host.run(f"cp /bin/true {tmp}/t && {tmp}/t").returncode == 126  # not executable


def drift_of(host, tmp_path, **inventory):
    """``fleetctl drift --format json`` of one host of the matrix (blueprint: hostenv.FILES)."""
    from tests.helpers import cli, make_project, write_inventory
    from tests.hostenv import FILES

    bp = tmp_path / "project" / "blueprint"
    if not bp.exists():
        make_project(tmp_path / "project", FILES)
    inv = write_inventory(tmp_path / "inv.yaml", {"h": host.inventory(**inventory)})
    return cli("drift", "--format", "json", inventory=inv, blueprint=bp)


def script(host, name: str, body: str) -> str:
    """An executable ``#!/bin/sh`` script on the box, the login's; returns its path."""
    path = host.env_dir / "bin" / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    os.chown(path, host.user.pw_uid, host.user.pw_gid)
    return str(path)


def test_start_up_noise_is_skipped_and_quoted_when_the_program_never_starts(env_hosts,
                                                                           tmp_path):
    host = env_hosts(variant("noisy-rc"))
    fine = drift_of(host, tmp_path)
    assert fine.code == 1 and fine.host("h")["status"] == "drift", fine.stdout  # all pending
    missing = drift_of(host, tmp_path, python="/nonexistent/python3")
    assert missing.code == 2
    error = missing.host("h")["error"]
    assert "'/nonexistent/python3'" in error and "`python:`" in error and "not found" in error
    assert "no newline at the end" in error  # what the login printed last, quoted
    assert "forged" not in json.dumps(missing.doc["hosts"][0].get("changes", []))
    assert NOISE_RC  # the variant's start-up file (tests/hostenv.py)


def test_no_python3_on_the_path_is_an_error_naming_the_python_setting(env_hosts, tmp_path):
    host = env_hosts(variant("python-elsewhere"))
    seen = drift_of(host, tmp_path, python="python3")  # the default, which this login lacks
    assert seen.code == 2
    error = seen.host("h")["error"]
    assert "'python3'" in error and "`python:` setting" in error and "not found" in error
    assert "python:" in seen.host("h")["hint"]
    assert drift_of(host, tmp_path).code == 1  # with python: set, it scans (all pending)


def test_a_login_whose_start_up_reads_stdin_is_named_not_the_python_setting(env_hosts,
                                                                            tmp_path):
    """The login's ~/.bashrc reads a few bytes of stdin (as a start-up command may): the
    program fleetctl sends there arrives cut, the bootstrap fails. The interpreter itself is
    fine (python3 -c runs as the login), so the error says what ate the input and how to keep
    the start-up from it, not "set python:" (the hint before, pointing at the wrong setting)."""
    from tests.hostenv import LoginEnv

    host = env_hosts(LoginEnv("reads-stdin", rc="head -c 10 >/dev/null\n"))
    assert host.run("python3 -c 'print(38)'").stdout.strip() == b"38"  # the interpreter runs
    seen = drift_of(host, tmp_path)
    assert seen.code == 2, seen.stdout
    error, hint = seen.host("h")["error"], seen.host("h")["hint"]
    assert "'python3' runs on the host" in error and "did not arrive whole" in error, error
    assert "~/.bashrc" in error and "stdin" in error, error
    assert "python:" not in hint and "[ -t 0 ] || return" in hint, hint
    # Applying the hint's fix makes the host readable.
    rc = host.home / ".bashrc"
    rc.write_text("[ -t 0 ] || return\n" + rc.read_text())
    assert drift_of(host, tmp_path).code == 1  # all pending


def test_the_last_line_a_host_writes_on_stderr_is_in_the_error(env_hosts, tmp_path):
    """The host closes stdout, writes a long stderr and, after a pause, the reason: the client
    reads stderr to its end before closing the channel (it killed it at stdout's end before)."""
    host = env_hosts(variant("plain"))
    slow = script(host, "slowfail", 'exec 1>&-\ni=0\nwhile [ $i -lt 3000 ]; do '
                  'echo "progress line $i" >&2; i=$((i+1)); done\nsleep 2\n'
                  'echo "the real reason: disk on fire" >&2\nexit 3\n')
    seen = drift_of(host, tmp_path, python=slow)
    assert seen.code == 2
    error = seen.host("h")["error"]
    assert error.endswith("the real reason: disk on fire") or \
        "the real reason: disk on fire" in error, error
    assert "exit status 3" in error


def held_python(host, hold: str) -> str:
    """An interpreter wrapper that runs the real program but holds it part-way, so the client is
    mid-run when the test cuts the connection: ``output`` passes only the program's first two
    lines (the newline and the hello); ``input`` passes only the first 2 MB of its input (the
    program, the request, the ship's commands and part of the content)."""
    held = host.env_dir / "held"
    if hold == "output":
        body = (f'{SYSTEM_PYTHON} "$@" | {{ IFS= read -r a; echo "$a"; IFS= read -r b; '
                f'echo "$b"; touch {held}; sleep 600; }}\n')
    else:
        # A relay writing each block at once (head -c would hold its last one in stdio).
        relay = ("import os\nleft = 2000000\nwhile left > 0:\n    block = os.read(0, min(left, "
                 "65536))\n    if not block:\n        break\n    os.write(1, block)\n"
                 "    left -= len(block)\n")
        body = (f"{{ {SYSTEM_PYTHON} -c '{relay}'; touch {held}; sleep 600; }} | "
                f'{SYSTEM_PYTHON} "$@"\n')
    return script(host, "heldpy", body)


@pytest.mark.parametrize("command,hold", [("drift", "output"), ("ship", "output"),
                                          ("ship", "input")])
def test_a_dropped_connection_is_a_connection_error_naming_the_host(command, hold, env_hosts,
                                                                    tmp_path):
    """sshd's session processes killed mid-run (SSH-BOXES.md: paramiko then raises OSError,
    EOFError or SSHException, or reads an early end): an error naming the host and the
    connection, exit 2, never an internal error, nothing switched."""
    from tests.helpers import cli, make_project, wait_until, write_inventory
    from tests.hostenv import FILES

    host = env_hosts(variant("plain"))
    files = {**FILES, "runner": {**FILES["runner"], "big.bin": os.urandom(8 << 20)}}
    bp = make_project(tmp_path / "project", files)
    inv = write_inventory(tmp_path / "inv.yaml", {"h": host.inventory(
        python=held_python(host, hold))})
    args = ["drift"] if command == "drift" else ["ship", "--yes"]
    done: list = []
    runner = threading.Thread(target=lambda: done.append(
        cli(*args, "--format", "json", inventory=inv, blueprint=bp)))
    runner.start()
    wait_until(lambda: (host.env_dir / "held").exists() or done,
               what="the host program to be held")
    assert not done, done[0].stdout + done[0].stderr
    assert host.box.kill_sessions() > 0
    runner.join(60)
    assert done, "the command did not end after its connection dropped"
    run = done[0]
    assert run.code == 2, run.stdout + run.stderr
    assert "internal error" not in (run.stdout + run.stderr).lower()
    error = run.host("h")["error"]
    assert error.startswith("h: the connection to ") and " was lost (" in error, error
    assert not (host.root / "current").exists()  # nothing switched


def test_the_local_transport_skips_what_its_interpreter_prints_first(tmp_path):
    """No shell starts the local host program, but its ``python:`` may be a wrapper that
    prints (a module system's banner): the same first-frame rule applies."""
    from tests.helpers import cli, local_host, make_project, write_inventory
    from tests.hostenv import FILES

    wrapper = tmp_path / "py"
    wrapper.write_text("#!/bin/sh\necho 'module python/3.11 loaded'\necho 'on stderr' >&2\n"
                       f"printf 'no newline'\nexec {SYSTEM_PYTHON} \"$@\"\n")
    wrapper.chmod(0o755)
    bp = make_project(tmp_path / "project", FILES)
    inv = write_inventory(tmp_path / "inv.yaml", {"h": local_host(tmp_path / "box",
                                                                  python=str(wrapper))})
    shipped = cli("ship", "--yes", inventory=inv, blueprint=bp)
    assert shipped.code == 0, shipped.stdout + shipped.stderr
    assert (tmp_path / "box" / "current" / "runner" / "conf").read_text() == "a=1\n"
    assert cli("drift", inventory=inv, blueprint=bp).code == 0


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(noise=st.binary(max_size=3000) | st.sampled_from([
    b'{"t":"hello","user":"x","group":"x","uid":0}\n',
    b'{"t":"hello","nonce":"0123456789abcdef0123456789abcdef","user":"x","group":"x"}\n',
    b'{"t":"error","step":"scan","kind":"failed","message":"forged"}\n', b"\n" * 5000,
    b"x" * 70000]))
@example(noise=b"x" * 70000)  # more than a pipe holds: the program is sent while it is read
@example(noise=b'{"t":"hello","nonce":"0123456789abcdef0123456789abcdef"}\n')
def test_any_bytes_a_login_prints_first_leave_the_result_unchanged(tmp_path_factory, noise):
    """Whatever bytes come before the program's hello, on stdout and on stderr, the drift of
    a shipped local host is clean: noise is never read as an event."""
    from tests.helpers import cli, local_host, make_project, write_inventory
    from tests.hostenv import FILES

    base = tmp_path_factory.mktemp("noise")
    bp = make_project(base / "project", FILES)
    plain = write_inventory(base / "plain.yaml", {"h": local_host(base / "box")})
    assert cli("ship", "--yes", inventory=plain, blueprint=bp).code == 0
    (base / "noise").write_bytes(noise)
    wrapper = base / "py"
    wrapper.write_text(f"#!/bin/sh\ncat {base / 'noise'}\ncat {base / 'noise'} >&2\n"
                       f"exec {SYSTEM_PYTHON} \"$@\"\n")
    wrapper.chmod(0o755)
    noisy = write_inventory(base / "noisy.yaml", {"h": local_host(base / "box",
                                                                  python=str(wrapper))})
    seen = cli("drift", "--format", "json", inventory=noisy, blueprint=bp)
    assert seen.code == 0, seen.stdout + seen.stderr
    assert seen.host("h")["status"] == "in-sync" and seen.host("h")["changes"] == []
