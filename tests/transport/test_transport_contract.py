"""One contract, both transports: the same blueprint of hostile names ships byte-exact through the
``local`` and the ``ssh`` transport, nothing in a name is ever run by a shell, and drift's JSON
escapes names that are not UTF-8 reversibly.

Expected trees are computed here from the spec (hashlib, explicit modes), live trees read with
``snapshot`` (os.lstat), so neither side uses fleetctl's code.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import (
    Symlink,
    cli,
    local_host,
    make_project,
    snapshot,
    ssh_host,
    without_inodes,
    write_inventory,
)

PWNED = ("/tmp/pwned", "/tmp/pwned-backtick", "/tmp/pwned-semicolon")

NFC = "\u00e9"  # é, one code point
NFD = "e\u0301"  # e + combining acute accent
assert NFC.encode() != NFD.encode()

# blueprint/runner: every name a shell, a terminal, a JSON encoder or a Unicode normaliser
# could mangle. "$(touch /tmp/pwned)" contains "/", so it is a path of three components.
RUNNER: dict = {
    "with space": "#!/bin/sh\necho space\n",
    "single'quote": "single\n",
    'double"quote': "double\n",
    "$(touch ": {"tmp": {"pwned)": "dollar\n"}},
    "`touch ": {"tmp": {"pwned-backtick`": "backtick\n"}},
    "; touch ": {"tmp": {"pwned-semicolon": "semicolon\n"}},
    "*": "star\n",
    "-rf": "dash\n",
    "new\nline": "newline\n",
    b"bad\xff": b"not utf-8 name\n",
    b"mix\\\xfe": b"backslash and a bad byte\n",
    NFC: "nfc\n",
    NFD: "nfd\n",
    "crlf.txt": b"one\r\ntwo\r\n",
    "no-final-newline.txt": b"no final newline",
    "tpl.txt.j2": b"HOST={{ host.name }}\r\nX=1",
    "link to space": Symlink("with space"),
    b"link\xff": Symlink(b"bad\xff"),
}
EXECUTABLE = ("runner/with space", "runner/-rf")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_tree(host_name: str) -> dict[bytes, tuple]:
    """The tree under ``current/`` for ``host_name``, as ``without_inodes(snapshot())`` gives it
    (everything owned by root: both transports log in / run as root here)."""
    out: dict[bytes, tuple] = {b"runner": ("dir", 0o755, 0, 0, None)}

    def add(prefix: bytes, spec: dict) -> None:
        for name, value in spec.items():
            rel = prefix + b"/" + os.fsencode(name)
            if isinstance(value, dict):
                out[rel] = ("dir", 0o755, 0, 0, None)
                add(rel, value)
            elif isinstance(value, Symlink):
                out[rel] = ("symlink", None, 0, 0, os.fsencode(value.target))
            else:
                data = value.encode() if isinstance(value, str) else value
                if rel.endswith(b".j2"):
                    rel = rel[:-3]
                    data = data.replace(b"{{ host.name }}", host_name.encode())
                mode = 0o755 if os.fsdecode(rel) in EXECUTABLE else 0o644
                out[rel] = ("file", mode, 0, 0, _sha(data))

    add(b"runner", RUNNER)
    out[b"agents"] = ("dir", 0o755, 0, 0, None)
    out[b"agents/w1"] = ("dir", 0o755, 0, 0, None)
    out[b"agents/w1/agent.yaml"] = ("file", 0o644, 0, 0, _sha(b"agent: w1\nrole: worker\n"))
    return out


@pytest.fixture(scope="module")
def blueprint(tmp_path_factory) -> Path:
    """The one blueprint both transports ship (a git repo holding every hostile name)."""
    return make_project(tmp_path_factory.mktemp("contract"), {"runner": RUNNER},
                        executable=EXECUTABLE)


@pytest.fixture(params=["local", "ssh"])
def host(request, tmp_path):
    """(host name, inventory, root) for one transport; the root's own name is hostile too."""
    root = tmp_path / "host root 'q' $(x)"
    if request.param == "local":
        spec = local_host(root)
    else:
        pool = request.getfixturevalue("sshd_pool")
        spec = ssh_host(pool[0], request.getfixturevalue("ssh_client_key"),
                        request.getfixturevalue("ssh_known_hosts"), root)
    name = f"{request.param}-box"
    inv = write_inventory(tmp_path / "inv.yaml", {name: spec})
    return name, inv, root


@pytest.fixture
def no_pwned():
    """Make sure no marker file exists before the test, and remove any the test made."""
    for path in PWNED:
        if os.path.lexists(path):
            os.unlink(path)
    yield
    leftovers = [p for p in PWNED if os.path.lexists(p)]
    for path in leftovers:
        os.unlink(path)


def spec_leaves(prefix: bytes, spec: dict) -> dict[bytes, object]:
    """Every file and symlink of a tree spec: blueprint-relative bytes path -> its value."""
    out: dict[bytes, object] = {}
    for name, value in spec.items():
        rel = prefix + b"/" + os.fsencode(name)
        if isinstance(value, dict):
            out.update(spec_leaves(rel, value))
        else:
            out[rel] = value
    return out


def test_blueprint_holds_every_hostile_name(blueprint):
    """Guard for the other tests: git tracks each hostile name as its exact bytes (read with
    ``-z``), with the executable bit and the symlink type, so the names reach fleetctl intact."""
    out = subprocess.run(["git", "-C", str(blueprint), "ls-files", "-z", "-s", "runner"],
                         capture_output=True, check=True).stdout
    tracked = {rec.partition(b"\t")[2]: rec.split()[0] for rec in out.split(b"\0") if rec}
    assert set(tracked) == set(spec_leaves(b"runner", RUNNER))
    assert tracked[b"runner/with space"] == b"100755"
    assert tracked[b"runner/*"] == b"100644"
    assert tracked[b"runner/link\xff"] == b"120000"


def test_ship_is_byte_exact_and_runs_nothing(host, blueprint, no_pwned):
    """Through either transport a ship produces exactly the expected tree (byte names incl.
    newline, non-UTF-8, NFC and NFD as two files; bytes incl. CRLF and no final newline; modes;
    symlink targets), drift is then clean (exit 0), and no shell ever ran a name."""
    name, inv, root = host
    run = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=blueprint)
    assert run.code == 0, run.stdout + run.stderr
    assert run.host(name)["status"] == "shipped"
    live = without_inodes(snapshot(os.path.realpath(root / "current")))
    assert live == expected_tree(name)
    current = os.fsencode(root / "current" / "runner")
    with open(os.path.join(current, b"crlf.txt"), "rb") as fh:
        assert fh.read() == b"one\r\ntwo\r\n"
    with open(os.path.join(current, b"tpl.txt"), "rb") as fh:
        assert fh.read() == f"HOST={name}\r\nX=1".encode()
    assert sorted(n for n in os.listdir(current) if n in (NFC.encode(), NFD.encode())) == sorted(
        [NFC.encode(), NFD.encode()])
    clean = cli("drift", "--format", "json", inventory=inv, blueprint=blueprint)
    assert clean.code == 0, clean.stdout + clean.stderr
    assert clean.host(name)["changes"] == []
    assert [p for p in PWNED if os.path.lexists(p)] == []


def test_drift_escapes_non_utf8_names(host, blueprint, no_pwned):
    """A hand-patched file whose name is not UTF-8 is reported in drift's JSON with
    ``path_escaped: true`` and the reversible escape (``bad\\xff``; a literal backslash doubled),
    a retargeted symlink's non-UTF-8 targets likewise (``target_escaped``), and names that are
    valid UTF-8 (a newline, NFD) come through unescaped."""
    name, inv, root = host
    assert cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=blueprint).code == 0
    runner = os.fsencode(root / "current" / "runner")
    for raw in (b"bad\xff", b"mix\\\xfe", b"new\nline", NFD.encode()):
        with open(os.path.join(runner, raw), "ab") as fh:
            fh.write(b"patched\n")
    os.unlink(os.path.join(runner, b"link\xff"))
    os.symlink(b"other\xfe", os.path.join(runner, b"link\xff"))
    run = cli("drift", "--format", "json", inventory=inv, blueprint=blueprint)
    assert run.code == 1, run.stdout + run.stderr
    changes = {c["path"]: c for c in run.host(name)["changes"]}
    assert set(changes) == {"runner/bad\\xff", "runner/mix\\\\\\xfe", "runner/new\nline",
                            "runner/" + NFD, "runner/link\\xff"}
    link = changes["runner/link\\xff"]
    assert (link["path_escaped"], link["change"], link["origin"]) == (True, "target", "hand-patch")
    assert (link["before"]["target"], link["before"].get("target_escaped")) == ("other\\xfe", True)
    assert (link["after"]["target"], link["after"].get("target_escaped")) == ("bad\\xff", True)
    for path in ("runner/bad\\xff", "runner/mix\\\\\\xfe"):
        assert changes[path]["path_escaped"] is True
        assert (changes[path]["change"], changes[path]["origin"]) == ("content", "hand-patch")
    for path in ("runner/new\nline", "runner/" + NFD):
        assert not changes[path].get("path_escaped", False)
        assert (changes[path]["change"], changes[path]["origin"]) == ("content", "hand-patch")
    # On the wire, JSON doubles the backslash once more.
    assert '"runner/bad\\\\xff"' in run.stdout
    assert [p for p in PWNED if os.path.lexists(p)] == []
