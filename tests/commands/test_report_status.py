"""``fleetctl status`` (and the report's runner records) never call what they could not read
fine: a notify spool, a ledger, a runs directory or a standing-denials directory that cannot be
read is "not read" in the text and ``null`` in the JSON, never "no escalation waiting", "no task
yet", "no turns yet" or 0; the agents of a host that could not be reached are "not read".

The records are made unreadable the way a real host can have them even for root: each is the
wrong type of file (a file where the runner keeps a directory, a directory where it keeps the
ledger), so the host program's ``listdir``/``open`` fail with ENOTDIR/EISDIR.
"""

from __future__ import annotations

import yaml

from tests.commands.test_report import make_fleet
from tests.helpers import cli

PARTS = {"runs", "notify", "ledger", "standing-denials"}


def test_records_not_read_are_never_called_none(tmp_path):
    agents = {"w1": {"role": "worker"}}
    inv, bp = make_fleet(tmp_path, agents=agents, roles={"worker": {"prompt": "work"}})
    state = tmp_path / "boxes" / "h1" / "state" / "w1"
    state.mkdir(parents=True)
    for name in ("runs", "notify", "standing-denials"):
        (state / name).write_text("a file where the runner keeps a directory\n")
    (state / "ledger.jsonl").mkdir()
    (tmp_path / "boxes" / "h2" / "state" / "w1").mkdir(parents=True)  # readable, empty
    body = yaml.safe_load(inv.read_text())
    body["hosts"]["down"] = {"transport": "ssh", "address": "127.0.0.1", "port": 1,
                             "user": "root", "root": "/srv/fleet", "agents": agents}
    inv.write_text(yaml.safe_dump(body))

    run = cli("status", "--json", "--timeout", "10", inventory=inv, blueprint=bp)
    assert run.code == 2, run.stdout + run.stderr
    agent = {h["host"]: h["agents"][0] for h in run.doc["hosts"]}
    bad, good, down = agent["h1"], agent["h2"], agent["down"]
    assert bad["read"] is True and set(bad["unread"]) == PARTS
    assert (bad["escalations_waiting"], bad["turns"], bad["attention"]) == (None, None, None)
    assert len(bad["errors"]) == 4
    assert (good["read"], good["unread"], good["escalations_waiting"], good["turns"],
            good["attention"]) == (True, [], 0, 0, False)
    assert (down["read"], down["escalations_waiting"], down["turns"], down["attention"]) == (
        False, None, None, None)

    text = cli("status", "--timeout", "10", inventory=inv, blueprint=bp).stdout
    lines = text.splitlines()
    bad_line = next(x for x in lines if x.lstrip("?! ").startswith("w1 (worker)")
                    and "not read" in x)
    assert bad_line.startswith("? ")
    for said in ("last task not read", "escalations not read", "ledger not read",
                 "standing denials not read"):
        assert said in bad_line, bad_line
    for never in ("no task yet", "no escalation waiting", "no turns yet"):
        assert never not in bad_line, bad_line
    assert "  not read: w1 (their tasks, escalations and turns are not known)" in lines
    good_line = [x for x in lines if x.lstrip().startswith("w1 (worker)") and x not in
                 (bad_line,)]
    assert good_line == ["  w1 (worker): no task yet; no escalation waiting; no turns yet"]

    # The report says the same: the records not read are named, the host down too.
    rep = cli("report", "--format", "json", "--timeout", "10", inventory=inv, blueprint=bp)
    errors = {(e["host"], e["agent"]) for e in rep.doc["runners"]["errors"]}
    assert errors == {("h1", "w1"), ("down", None)}
    assert rep.doc["runners"]["read"] is True and rep.doc["runners"]["attention"] == []
