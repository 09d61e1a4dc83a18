"""Bad inventory input: an error naming file, line and key path, exit 2, no traceback."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetctl.inventory import HostSpec
from tests.helpers import cli, make_project

GOOD_HOST = "    transport: local\n    root: box\n    agents:\n      w1: {role: worker}\n"


@pytest.mark.parametrize("body,expected", [
    ("hosts:\n  h:\n" + GOOD_HOST + "    colour: blue\n", "inv.yaml:7: hosts.h.colour: unknown key"),
    ("hosts:\n  h:\n    transport: local\n    root: box\n    port: abc\n",
     "inv.yaml:5: hosts.h.port: input should be a valid integer"),
    ("hosts:\n  h:\n    transport: local\n    root: box\n    agents:\n      w1: {role: nope}\n",
     "inv.yaml:6: hosts.h.agents.w1.role: no role 'nope' in the blueprint"),
    ("hosts:\n  h:\n    transport: local\n    root: [unclosed\n", "inv.yaml:5: invalid YAML"),
    ("hosts:\n  h:\n    address: x\n", "inv.yaml:2: hosts.h.root: required key is missing"),
    ("hosts:\n  h:\n    root: relative/path\n", "inv.yaml:3: hosts.h.root: must be an absolute path"),
    ("defaults:\n  transport: telnet\nhosts: {}\n", "inv.yaml:2: defaults.transport: input should be"),
    ("hosts:\n  'bad name':\n    root: /x\n", "hosts: value error"),
    # A name rule holds for the whole name: "$" alone let a trailing newline through (issue 19).
    ("hosts:\n  \"web1\\n\":\n" + GOOD_HOST, "hosts: value error"),
    ("hosts:\n  h:\n    transport: local\n    root: box\n    agents:\n      \"w1\\n\": {role: worker}\n",
     "value error"),
    # pydantic's patterns: its regex engine's "$" is the end (a trailing newline is refused).
    ("hosts:\n  h:\n    transport: local\n    root: box\n    agents:\n"
     "      w1: {role: worker, user: \"bob\\n\"}\n", "inv.yaml:6: hosts.h.agents.w1.user:"),
    ("hosts:\n  h:\n" + GOOD_HOST + "    python: \"/usr/bin/python3\\n\"\n",
     "inv.yaml:7: hosts.h.python:"),
    # A block scalar ends in a newline: the root would be a directory named "fleet\n" (issue 19).
    ("hosts:\n  h:\n    root: |\n      /srv/fleet\n",
     "inv.yaml:3: hosts.h.root: must not hold a control character (a newline, CR, tab, ESC...): "
     "got /srv/fleet\\x0a"),
    ("hosts:\n  h:\n    root: /srv/fleet\n    address: \"10.0.0.1\\n\"\n",
     "inv.yaml:4: hosts.h.address: must not hold a control character"),
    ("defaults:\n  user: \"deploy\\r\"\nhosts:\n  h: {root: /srv/fleet}\n",
     "inv.yaml:2: defaults.user: must not hold a control character"),
    ("hosts:\n  h:\n    root: /srv/fleet\n    known_hosts: \"kh\\x1b[31m\"\n",
     "inv.yaml:4: hosts.h.known_hosts: must not hold a control character"),
    ("hosts:\n  h:\n" + GOOD_HOST.replace("root: box", "root: \"box\\t\""),
     "inv.yaml:4: hosts.h.root: must not hold a control character"),
])
def test_bad_inventory(tmp_path, body, expected):
    bp = make_project(tmp_path, {})
    inv = tmp_path / "inv.yaml"
    inv.write_text(body)
    run = cli("drift", "--format", "json", inventory=inv, blueprint=bp)
    assert run.code == 2
    assert run.stdout == ""
    assert expected in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_unknown_host_name_is_an_input_error(tmp_path):
    bp = make_project(tmp_path, {})
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  h:\n" + GOOD_HOST)
    run = cli("drift", "nosuch", inventory=inv, blueprint=bp)
    assert run.code == 2 and "no host named nosuch" in run.stderr and "hosts in this inventory: h" in run.stderr


def test_missing_inventory_file(tmp_path):
    bp = make_project(tmp_path, {})
    run = cli("drift", inventory=tmp_path / "absent.yaml", blueprint=bp)
    assert run.code == 2 and "absent.yaml: file not found" in run.stderr


def test_bad_role_file_names_its_line(tmp_path):
    bp = make_project(tmp_path, {}, roles={"worker": {"prompt": "p", "max_retries": "many"}})
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  h:\n" + GOOD_HOST)
    run = cli("drift", inventory=inv, blueprint=bp)
    assert run.code == 2
    assert "roles/worker.yaml:1: max_retries: input should be a valid integer" in run.stderr


_SETTINGS = ["user", "identity_file", "known_hosts", "root", "systemd_unit_dir", "address"]


@given(key=st.sampled_from(_SETTINGS), before=st.text(max_size=10), after=st.text(max_size=10),
       control=st.sampled_from([chr(c) for c in [*range(0x20), *range(0x7f, 0xa0)]]))
def test_a_setting_with_any_control_character_is_refused(key, before, after, control):
    """Wherever a C0 or C1 control character or DEL sits in a host setting, the setting is
    refused, and the message shows the value escaped, on one line."""
    value = "/" + before + control + after
    with pytest.raises(ValidationError) as caught:
        HostSpec.model_validate({key: value})
    messages = [e["msg"] for e in caught.value.errors() if e["type"] == "control_character"]
    assert messages and all("\n" not in m and "\r" not in m and "\x1b" not in m
                            for m in messages), caught.value.errors()


@given(key=st.sampled_from(_SETTINGS),
       value=st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=20))
def test_a_setting_without_control_characters_is_not_refused_for_them(key, value):
    try:
        HostSpec.model_validate({key: "/" + value})
    except ValidationError as exc:
        assert all(e["type"] != "control_character" for e in exc.errors()), exc.errors()
