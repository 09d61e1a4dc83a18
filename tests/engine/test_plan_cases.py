"""The ship planner on case files (``tests/cases/plan/*.yaml``), the way pyinfra tests its
operations: desired, live and shipped manifests and the host's scan in, the expected plan out,
written by hand in each file. No host, no I/O: :func:`fleetctl.plan.plan_ship` is pure.

Case file keys: ``description``; ``state`` (``current``, ``current_kind``, ``identity``,
``shipped`` — a list of entries, ``same-as-live``, or ``[]`` — and ``unreadable``: paths);
``live`` and ``desired`` (entry lists, or ``same-as-live`` / ``same-as-shipped``); ``ancestry``
(relation and counts); ``options`` (``force``, ``force_paths``, ``renamed_from``, ``approved``);
``expect`` (``status``, ``step``, ``copies``, ``sends``, ``secrets``, ``forced_paths``,
``forced_stale``, ``reason_contains``, ``reason_excludes``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetctl.drift import compare
from fleetctl.livestate import LiveState, Unreadable
from fleetctl.inventory import Host
from fleetctl.manifest import Entry, Manifest
from fleetctl.plan import PlanOptions, plan_ship
from fleetctl.scan import shipped_base
from fleetctl.source import Ancestry

CASES = sorted((Path(__file__).parents[1] / "cases" / "plan").glob("*.yaml"))


def _manifest(spec, **named) -> Manifest:
    if isinstance(spec, str):
        return named[spec]
    return Manifest([Entry.from_json(e) for e in spec])


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_plan_case(case: Path):
    spec = yaml.safe_load(case.read_text())
    st = spec["state"]
    live = _manifest(spec["live"])
    shipped_spec = st.get("shipped")
    shipped = None if shipped_spec is None else _manifest(shipped_spec, **{"same-as-live": live})
    desired = _manifest(spec["desired"], **{"same-as-live": live, "same-as-shipped": shipped})
    state = LiveState(user="root", group="root", root_exists=st["current_kind"] is not None,
                      current=st["current"], current_kind=st["current_kind"],
                      shipped=shipped if st["current"] else None, live=live,
                      unreadable=[Unreadable(p, "Permission denied")
                                  for p in st.get("unreadable", [])],
                      identity=st.get("identity"))
    changes = compare(desired, live, shipped_base(state))
    a = spec["ancestry"]
    found = Ancestry(a["relation"], a.get("host_commit"), a.get("source_commit"),
                     a.get("ahead", 0), a.get("behind", 0))
    opts = spec.get("options") or {}
    options = PlanOptions(force=opts.get("force", False),
                          force_paths=tuple(p.strip("/") for p in opts.get("force_paths", [])),
                          renamed_from=opts.get("renamed_from"), approved=opts.get("approved"))
    host = Host(name="web1", address="web1", root="/srv/fleet")
    plan = plan_ship(host, state, desired, changes, found, [], options)

    want = spec["expect"]
    assert plan.status == want["status"], (plan.status, plan.reason)
    if "step" in want:
        assert plan.step == want["step"]
    if "copies" in want:
        assert [list(c) for c in plan.copies] == want["copies"]
    if "sends" in want:
        assert list(plan.sends) == want["sends"]
    if "secrets" in want:
        assert list(plan.secrets) == want["secrets"]
    if "forced_paths" in want:
        assert list(plan.forced_paths) == want["forced_paths"]
    if "forced_stale" in want:
        assert plan.forced is not None and plan.forced["stale"]["relation"] == want["forced_stale"]
    for text in want.get("reason_contains", []):
        assert text in (plan.reason or ""), plan.reason
    for text in want.get("reason_excludes", []):
        assert text not in (plan.reason or ""), plan.reason
    # What the prompt asks about: a new release, and only that.
    assert plan.needs_confirmation == (plan.status == "ready")
    if plan.status != "ready":
        assert not plan.sends and not plan.copies and not plan.secrets
