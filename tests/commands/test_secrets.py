"""Secrets (fleetctl/secrets.py): the masked type and the env/file/command sources.

Real files and real processes throughout. Every planted value is unique (``token_hex``) and is
compared through digests, never as a plain value, so that not even pytest's assertion rewriting
can print one; every text fleetctl could show is searched for it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pickle
import secrets as pysecrets
import sys
import time
import traceback
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

import fleetctl

from fleetctl.errors import InputError
from fleetctl.secrets import (
    REDACTED,
    CommandSource,
    EnvSource,
    FileSource,
    Secret,
    SecretSource,
    resolve_secret,
)
from fleetctl.yamlfile import load_model
from tests.helpers import wait_until

PY = sys.executable


def plant() -> bytes:
    """A unique value nobody could mistake for anything else."""
    return ("planted-" + pysecrets.token_hex(16)).encode()


def sha(value: bytes) -> str:
    return "sha256:" + hashlib.sha256(value).hexdigest()


def assert_absent(text: str | bytes, *values: bytes) -> None:
    """Assert no value (nor its text form) occurs in ``text``, without ever printing one."""
    data = text.encode() if isinstance(text, str) else text
    hits = [i for i, v in enumerate(values) if v in data]
    assert hits == [], f"planted value(s) #{hits} leaked"


PACKAGE_DIR = os.path.dirname(os.path.realpath(fleetctl.__file__))


def in_fleetctl(filename: str) -> bool:
    """Whether a frame's file is a module of the fleetctl package itself: below the package's
    own directory, not merely a path containing "fleetctl" (a clone in a directory named
    fleetctl has that in every path, its tests and its venv included)."""
    return os.path.realpath(filename).startswith(PACKAGE_DIR + os.sep)


def test_the_frame_filter_takes_fleetctl_modules_only():
    """The traceback search below looks at fleetctl's frames, never at the test's own (which
    hold the planted values on purpose), wherever the clone is. Before, the filter was
    ``"fleetctl/" in filename``: in a clone at ``.../fleetctl/`` every frame matched and the
    leak tests failed on the values they planted themselves."""
    import fleetctl.secrets

    assert in_fleetctl(fleetctl.secrets.__file__)
    assert not in_fleetctl(__file__)
    assert not in_fleetctl(pytest.__file__)
    assert not in_fleetctl(PACKAGE_DIR + "-other" + os.sep + "x.py")


def every_text(exc: BaseException) -> str:
    """Everything a traceback of ``exc`` could show: the formatted chain, plus the repr of every
    local of every fleetctl frame it passed through (what ``--showlocals`` or rich would print).
    The test's own frames are left out: they hold the planted values on purpose."""
    parts = ["".join(traceback.format_exception(exc)), str(exc), repr(exc),
             str(getattr(exc, "hint", ""))]
    seen: BaseException | None = exc
    while seen is not None:
        tb = seen.__traceback__
        while tb is not None:
            if in_fleetctl(tb.tb_frame.f_code.co_filename):
                parts += [f"{k}={v!r}" for k, v in tb.tb_frame.f_locals.items()]
            tb = tb.tb_next
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


def counting_command(tmp_path: Path, var: str, *, stderr: str = "", status: int = 0,
                     stdout_suffix: str = "\n") -> tuple[CommandSource, Path]:
    """A real program printing env ``var`` to stdout, appending a line to a count file per run.

    ``stderr`` is a template whose ``{NAME}`` fields are filled from the environment in the
    child, so no planted value ever sits on its command line."""
    count = tmp_path / f"count-{var}"
    script = (
        "import os, sys\n"
        f"open({str(count)!r}, 'a').write('x\\n')\n"
        f"sys.stdout.write(os.environ[{var!r}] + {stdout_suffix!r})\n"
        f"sys.stderr.write({stderr!r}.format_map(os.environ))\n"
        f"sys.exit({status})\n")
    return CommandSource(command=(PY, "-c", script)), count


def runs(count: Path) -> int:
    return len(count.read_text().splitlines()) if count.exists() else 0


# --- the type ---------------------------------------------------------------------------------

def test_secret_text_forms_are_masked_and_reveal_is_exact():
    value = plant()
    s = Secret(value)
    shown = [str(s), repr(s), f"{s}", f"{s!r}", f"{s!s}", format(s), format(s, ">60"),
             "%s" % s, "%r" % s, str([s]), str({"k": s}), str((s,))]
    for text in shown:
        assert_absent(text, value)
        assert "Secret(sha256:" in text
    assert str(s) == f"Secret({sha(value)[:15]}…)"
    assert s.digest == sha(value)
    assert sha(s.reveal()) == sha(value) and type(s.reveal()) is bytes


def test_secret_equality_and_hash_by_digest():
    value = plant()
    a, b, c = Secret(value), Secret(bytes(value)), Secret(plant())
    assert (a == b) is True and (a != c) is True
    assert hash(a) == hash(b) and len({a, b, c}) == 2
    assert (a == value) is False  # a secret never equals its plain bytes


def test_secret_refuses_serialisation_and_mutation():
    value = plant()
    s = Secret(value)
    for attempt in (lambda: pickle.dumps(s), lambda: pickle.dumps([s], protocol=0),
                    lambda: json.dumps(s), lambda: json.dumps({"token": s})):
        with pytest.raises(TypeError) as info:
            attempt()
        assert_absent(every_text(info.value), value)
    assert_absent(json.dumps({"token": s}, default=str), value)  # a careless default masks
    assert copy.copy(s) is s and copy.deepcopy({"k": s})["k"] is s
    with pytest.raises(AttributeError):
        s._value = b"other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Secret("text")  # type: ignore[arg-type]


# --- sources: validation ------------------------------------------------------------------------

class _Holder(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: SecretSource


def test_source_shapes_validate():
    adapter = TypeAdapter(SecretSource)
    assert adapter.validate_python({"env": "GH_TOKEN"}) == EnvSource(env="GH_TOKEN")
    assert adapter.validate_python({"file": "s/x"}) == FileSource(file="s/x")
    cmd = adapter.validate_python({"command": ["pass", "show", "x"], "timeout_s": 5})
    assert cmd == CommandSource(command=("pass", "show", "x"), timeout_s=5)
    for bad in ({"env": "1X"}, {"env": "A", "file": "b"}, {"command": []}, {"command": [""]},
                {"command": ["x"], "timeout_s": 0}, {"vault": "x"}, "GH_TOKEN", {"file": ""}):
        with pytest.raises(ValidationError):
            adapter.validate_python(bad)


def test_bad_source_in_yaml_is_an_input_error_naming_file_and_key(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("token:\n  envv: GH_TOKEN\n")
    with pytest.raises(InputError) as info:
        load_model(path, _Holder)
    assert "inv.yaml:1: token: expected a secret source" in info.value.message
    cases = {
        "token:\n  env: GH_TOKEN\n  shell: true\n": "inv.yaml:3: token.shell: unknown key",
        "token:\n  env: 1X\n": "inv.yaml:2: token.env: value error, '1X' is not an environment",
        "token:\n  command: []\n": "inv.yaml:2: token.command: tuple should have at least 1",
        "token:\n  command: [pass]\n  timeout_s: 0\n": "inv.yaml:3: token.timeout_s: input",
    }
    for text, expected in cases.items():
        path.write_text(text)
        with pytest.raises(InputError) as info:
            load_model(path, _Holder)
        assert expected in info.value.message


def test_inline_value_is_refused_without_echoing_it(tmp_path):
    value = plant()
    path = tmp_path / "inv.yaml"
    path.write_text(f"token: {value.decode()}\n")
    with pytest.raises(InputError) as info:
        load_model(path, _Holder)
    assert "token: expected a secret source" in info.value.message
    # The message and the printed traceback; load_model's own frame holds the parsed file.
    assert_absent(str(info.value) + "".join(traceback.format_exception(info.value)), value)


# --- env --------------------------------------------------------------------------------------

def test_env_source_resolves_once_and_masks(tmp_path, monkeypatch):
    value = plant()
    monkeypatch.setenv("FLEET_T_ENV", value.decode())
    cache: dict = {}
    s = resolve_secret(EnvSource(env="FLEET_T_ENV"), tmp_path, cache)
    assert s.digest == sha(value)
    monkeypatch.setenv("FLEET_T_ENV", plant().decode())  # a later change is not re-read this run
    again = resolve_secret(EnvSource(env="FLEET_T_ENV"), tmp_path, cache)
    assert again is s and len(cache) == 1
    assert_absent(repr(cache) + str(cache), value)


def test_env_source_missing_or_empty(tmp_path, monkeypatch):
    monkeypatch.delenv("FLEET_T_NOPE", raising=False)
    with pytest.raises(InputError) as info:
        resolve_secret(EnvSource(env="FLEET_T_NOPE"), tmp_path, {})
    assert "environment variable FLEET_T_NOPE" in info.value.message
    assert "not set" in info.value.message
    monkeypatch.setenv("FLEET_T_EMPTY", "")
    with pytest.raises(InputError) as info:
        resolve_secret(EnvSource(env="FLEET_T_EMPTY"), tmp_path, {})
    assert "FLEET_T_EMPTY" in info.value.message and "empty" in info.value.message


# --- file -------------------------------------------------------------------------------------

def _secret_file(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.write(fd, data)
    os.close(fd)
    os.chmod(path, mode)
    return path


def test_file_source_relative_to_base_strips_exactly_one_newline(tmp_path):
    value = plant()
    base = tmp_path / "inventory"
    _secret_file(base / "secrets" / "one", value + b"\n")
    _secret_file(base / "secrets" / "two", value + b"\n\n", mode=0o400)
    _secret_file(base / "secrets" / "raw", value + b" \r")
    cache: dict = {}
    assert resolve_secret(FileSource(file="secrets/one"), base, cache).digest == sha(value)
    assert resolve_secret(FileSource(file="secrets/two"), base, cache).digest == sha(value + b"\n")
    assert resolve_secret(FileSource(file="secrets/raw"), base, cache).digest == sha(value + b" \r")
    abs_src = FileSource(file=str(base / "secrets" / "one"))
    assert resolve_secret(abs_src, tmp_path, cache) is cache[("file", str(base / "secrets/one"))]
    assert len(cache) == 3  # the same file by two spellings is read once


def test_file_source_read_once_per_run(tmp_path):
    value = plant()
    path = _secret_file(tmp_path / "s", value)
    cache: dict = {}
    first = resolve_secret(FileSource(file="s"), tmp_path, cache)
    path.unlink()  # gone now: a second request must not touch the disk
    assert resolve_secret(FileSource(file="s"), tmp_path, cache) is first


def test_file_source_refuses_open_modes_and_names_the_file(tmp_path):
    value = plant()
    for mode in (0o640, 0o604, 0o620, 0o644):
        path = tmp_path / f"open-{mode:o}"
        _secret_file(path, value, mode=mode)
        with pytest.raises(InputError) as info:
            resolve_secret(FileSource(file=path.name), tmp_path, {})
        assert path.name in info.value.message and f"{mode:04o}" in info.value.message
        assert "chmod 600" in info.value.hint
        assert_absent(every_text(info.value), value)


def test_file_source_missing_empty_or_directory(tmp_path):
    with pytest.raises(InputError) as info:
        resolve_secret(FileSource(file="no/such"), tmp_path, {})
    assert "no/such" in info.value.message and "not found" in info.value.message
    (tmp_path / "inventory").mkdir()
    _secret_file(tmp_path / "inventory" / "empty", b"\n")
    with pytest.raises(InputError) as info:
        resolve_secret(FileSource(file="empty"), tmp_path / "inventory", {})
    # Named as every other error of a file source names it: a path usable from here (the
    # file is relative to the inventory's directory; before, 'file empty' was printed).
    assert f"file {tmp_path / 'inventory' / 'empty'}: the value is empty" in info.value.message
    (tmp_path / "d").mkdir(mode=0o700)
    with pytest.raises(InputError) as info:
        resolve_secret(FileSource(file="d"), tmp_path, {})
    assert "not a regular file" in info.value.message


# --- command ----------------------------------------------------------------------------------

def test_command_source_value_from_stdout_run_once(tmp_path, monkeypatch):
    value = plant()
    monkeypatch.setenv("FLEET_T_CMD", value.decode())  # handed down by the environment, not argv
    src, count = counting_command(tmp_path, "FLEET_T_CMD")
    cache: dict = {}
    s = resolve_secret(src, tmp_path, cache)
    assert s.digest == sha(value) and runs(count) == 1
    same = CommandSource(command=tuple(src.command))  # an equal source spelled anew
    assert resolve_secret(same, tmp_path, cache) is s and runs(count) == 1
    assert_absent(" ".join(src.command), value)


def test_command_source_strips_one_newline_runs_in_base_dir_stdin_closed(tmp_path):
    base = tmp_path / "inv"
    base.mkdir()
    script = ("import os, sys\n"
              "data = sys.stdin.read()\n"
              "sys.stdout.write(os.getcwd() + '|' + repr(data) + '\\n\\n')\n")
    s = resolve_secret(CommandSource(command=(PY, "-c", script)), base, {})
    expected = f"{os.path.realpath(base)}|''\n".encode()
    assert s.digest == sha(expected)


def test_command_failure_stderr_is_redacted_of_every_known_value(tmp_path, monkeypatch):
    earlier, own = plant(), plant()
    monkeypatch.setenv("FLEET_T_EARLIER", earlier.decode())
    monkeypatch.setenv("FLEET_T_OWN", own.decode())
    cache: dict = {}
    resolve_secret(EnvSource(env="FLEET_T_EARLIER"), tmp_path, cache)
    stderr = ("decrypt failed for {FLEET_T_OWN}\n"
              "previous token was {FLEET_T_EARLIER} (sic)\n"
              "key {FLEET_T_OWN} rejected\n")
    src, count = counting_command(tmp_path, "FLEET_T_OWN", stderr=stderr, status=3)
    assert_absent(" ".join(src.command), earlier, own)  # values reach it by the environment
    with pytest.raises(InputError) as info:
        resolve_secret(src, tmp_path, cache)
    message = info.value.message
    assert_absent(every_text(info.value), earlier, own)
    assert f"command {PY}" in message and "exited with status 3" in message
    assert f"decrypt failed for {REDACTED}\nprevious" in message
    assert f"previous token was {REDACTED} (sic)" in message
    assert runs(count) == 1 and len(cache) == 1  # a failure is not cached as a value


def test_command_failure_traceback_shows_no_value(tmp_path, monkeypatch):
    value = plant()
    monkeypatch.setenv("FLEET_T_TB", value.decode())
    src, _ = counting_command(tmp_path, "FLEET_T_TB", stderr="oops {FLEET_T_TB}", status=1)
    try:
        resolve_secret(src, tmp_path, {})
    except InputError as exc:
        formatted = traceback.format_exc()
        captured = every_text(exc)
    else:
        pytest.fail("the command failed but no error was raised")
    assert_absent(formatted, value)
    assert_absent(captured, value)
    assert "oops " + REDACTED in formatted


def test_command_stderr_is_quoted_as_a_tail(tmp_path):
    script = ("import sys\n"
              "sys.stderr.write(''.join('line %d\\n' % i for i in range(500)))\n"
              "sys.exit(2)\n")
    with pytest.raises(InputError) as info:
        resolve_secret(CommandSource(command=(PY, "-c", script)), tmp_path, {})
    message = info.value.message
    assert "line 499" in message and "line 480" not in message and len(message) < 1000


def _gone(pid: int) -> bool:
    """True when process ``pid`` no longer runs (exited, or a zombie awaiting its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_command_killed_after_timeout_with_its_children(tmp_path):
    # The grandchild writes its pid (so the test knows which process must die with the group),
    # then tells the command on a pipe, which the command blocks on before its endless wait.
    # Both wait with signal.pause(): for nothing, until they are killed.
    pid_file = tmp_path / "grandchild.pid"
    child = (f"import os, signal; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
             "print('started', flush=True); signal.pause()")
    script = ("import signal, subprocess, sys\n"
              f"child = subprocess.Popen([sys.executable, '-c', {child!r}], "
              "stdout=subprocess.PIPE)\n"
              "child.stdout.readline()\n"
              "signal.pause()\n")
    # The timeout must come after the grandchild started: short at first, doubled only while a
    # busy machine had the command killed before that (no fixed guess at how long it takes).
    timeout_s = 1
    while True:
        started = time.monotonic()
        with pytest.raises(InputError) as info:
            resolve_secret(CommandSource(command=(PY, "-c", script), timeout_s=timeout_s),
                           tmp_path, {})
        assert time.monotonic() - started < 120  # not held up by a command that waits forever
        assert f"did not finish within {timeout_s} s" in info.value.message
        if pid_file.exists() and pid_file.read_text():
            break
        assert timeout_s < 32, "the grandchild never started before the timeout"
        timeout_s *= 2
    grandchild = int(pid_file.read_text())
    # It went with its group (it meant to wait forever).
    assert wait_until(lambda: _gone(grandchild), what="the grandchild to be gone")


def test_command_not_found_empty_output_and_signal(tmp_path):
    with pytest.raises(InputError) as info:
        resolve_secret(CommandSource(command=("fleet-no-such-program", "x")), tmp_path, {})
    assert "command fleet-no-such-program: program not found" in info.value.message
    with pytest.raises(InputError) as info:
        resolve_secret(CommandSource(command=(PY, "-c", "print()")), tmp_path, {})
    assert "empty" in info.value.message
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    with pytest.raises(InputError) as info:
        resolve_secret(CommandSource(command=(PY, "-c", kill)), tmp_path, {})
    assert "killed by signal 15" in info.value.message


def test_nothing_written_to_disk_while_resolving(tmp_path, monkeypatch):
    """Resolving through every source leaves no file holding a value under the run's dirs."""
    values = [plant() for _ in range(3)]
    monkeypatch.setenv("FLEET_T_D0", values[0].decode())
    monkeypatch.setenv("FLEET_T_D2", values[2].decode())
    _secret_file(tmp_path / "f", values[1])
    src, _ = counting_command(tmp_path, "FLEET_T_D2")
    cache: dict = {}
    for source in (EnvSource(env="FLEET_T_D0"), FileSource(file="f"), src):
        resolve_secret(source, tmp_path, cache)
    home = Path(os.environ["HOME"])
    for root in (tmp_path, home):
        for path in root.rglob("*"):
            if path.is_file() and path != tmp_path / "f":
                assert_absent(path.read_bytes(), *values)
