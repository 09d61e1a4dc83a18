"""Output people read fits the terminal: drift and ship tables at 80 columns wrap paths after a
``/`` and never inside a name; text to a pipe is not padded; a first ship over many hosts is a
line per host unless ``--all-paths``; ``--quiet`` shows only the hosts with a problem."""

from __future__ import annotations

import hashlib
import io

from rich.console import Console

from fleetctl.blueprint import load_blueprint
from fleetctl.inventory import load_inventory
from fleetctl.cli.output.results import print_text
from fleetctl.results import NoProgress
from fleetctl.ship import drift_host, run_hosts
from fleetctl.source import inspect_source
from fleetctl.cli.output.text import wrap_path
from tests.helpers import cli, git, local_host, make_project, write_inventory

LONG = ["runner/conf.d/long-directory-name/and-another-one/a-long-file-name.conf",
        "runner/plugins/cache-warmup/bin/warm-the-o200k-cache.sh",
        "runner/x.txt"]
"""Paths longer than the path column at 80 columns (24), each name shorter than it."""


def _tree(paths: list[str]) -> dict:
    spec: dict = {}
    for p in paths:
        node = spec
        parts = p.split("/")[1:]  # under runner/
        for d in parts[:-1]:
            node = node.setdefault(d, {})
        node[parts[-1]] = "v1\n"
    return spec


def test_change_table_at_80_columns_wraps_paths_between_names(tmp_path):
    bp = make_project(tmp_path, {"runner": _tree(LONG)})
    inv = write_inventory(tmp_path / "inv.yaml", {"h1": local_host(tmp_path / "h1", {})})
    assert cli("ship", "--yes", inventory=inv, blueprint=bp).code == 0
    for p in LONG:
        (tmp_path / "h1" / "current" / p).write_text("patched on the host\n")
    blueprint = load_blueprint(bp)
    inventory = load_inventory(inv, blueprint=blueprint)
    source = inspect_source(blueprint.root, blueprint.templates, inventory.path)
    results = run_hosts(inventory.hosts, lambda h: drift_host(blueprint, h, NoProgress(),
                                                              source), 1)
    assert {c.path for c in results[0].changes} == set(LONG)
    out = io.StringIO()
    print_text(Console(file=out, width=80, no_color=True), results, "drift", source)
    lines = out.getvalue().splitlines()
    table_lines = [line for line in lines if not line.startswith(("source:", "h1:"))]
    assert table_lines and max(len(line) for line in table_lines) <= 80, out.getvalue()
    header = next(line for line in lines if "path" in line and "desired" in line)
    assert header.split() == ["path", "change", "origin", "live", "desired"]
    # Both short digests (12 hex digits, computed here) whole on each change's first line.
    live_d = hashlib.sha256(b"patched on the host\n").hexdigest()[:12]
    desired_d = hashlib.sha256(b"v1\n").hexdigest()[:12]
    rows = [line for line in table_lines if "hand-patch" in line]
    assert len(rows) == 3 and all(live_d in r and desired_d in r for r in rows), table_lines
    table = "\n".join(lines)
    for p in LONG:
        for name in p.split("/"):
            assert any(name in line for line in lines), (name, table)
    # Each path is in the table as its own wrapped pieces, in order, each ending at a "/".
    first_col = [line[:line.find("  ", 1)].strip() for line in lines if line.startswith(" ")]
    joined = "".join(first_col)
    for p in LONG:
        assert p in joined, (p, first_col)


def test_wrap_path_breaks_only_after_a_slash():
    path = "skills/forge/bin/forge-pr-create"
    assert wrap_path(path, 18).split("\n") == ["skills/forge/bin/", "forge-pr-create"]
    assert wrap_path(path, 100) == path
    assert wrap_path("a/" + "x" * 30, 10).replace("\n", "") == "a/" + "x" * 30


def test_piped_text_is_not_padded(tmp_path):
    bp = make_project(tmp_path, {"runner": _tree(LONG)})
    inv = write_inventory(tmp_path / "inv.yaml", {"h1": local_host(tmp_path / "h1", {})})
    assert cli("ship", "--yes", inventory=inv, blueprint=bp).code == 0
    (tmp_path / "h1" / "current" / "runner" / "x.txt").write_text("patched\n")
    run = cli("drift", inventory=inv, blueprint=bp)
    assert run.code == 1
    assert "runner/x.txt" in run.stdout
    assert [line for line in run.stdout.splitlines() if line != line.rstrip()] == []
    out = tmp_path / "drift.txt"
    assert cli("drift", "--output", str(out), inventory=inv, blueprint=bp).code == 1
    assert [line for line in out.read_text().splitlines() if line != line.rstrip()] == []


def test_first_ship_summarised_per_host_unless_all_paths(tmp_path):
    files = {f"f{i:02d}.txt": f"{i}\n" for i in range(14)}
    bp = make_project(tmp_path, {"runner": {"conf": files, "README": "r\n"}})
    hosts = {f"h{i}": local_host(tmp_path / f"h{i}", {}) for i in range(3)}
    inv = write_inventory(tmp_path / "inv.yaml", hosts)
    # What a first ship writes, counted here: runner/, runner/conf/, 14 files, README.
    expected = 1 + 1 + 14 + 1
    everything = cli("ship", "--dry-run", "--all-paths", inventory=inv, blueprint=bp)
    assert everything.code == 0, everything.stdout + everything.stderr
    for i in range(14):
        assert everything.stdout.count(f"runner/conf/f{i:02d}.txt") == 3
    run = cli("ship", "--yes", inventory=inv, blueprint=bp)
    assert run.code == 0, run.stdout + run.stderr
    assert "f03.txt" not in run.stdout
    for h in hosts:
        assert (f"{h}: first ship: {expected} path(s): runner/ ({expected}); --all-paths "
                "lists them") in run.stdout
        assert f"{h}: shipped release" in run.stdout
    # Later ships list their (few) paths as before.
    (bp / "runner" / "README").write_text("r2\n")
    git(tmp_path, "commit", "-qam", "r2")
    again = cli("ship", "--yes", inventory=inv, blueprint=bp)
    assert again.code == 0 and again.stdout.count("runner/README") == 3


def test_quiet_shows_only_hosts_with_a_problem(tmp_path):
    bp = make_project(tmp_path, {"runner": {"x.txt": "x\n"}})
    inv = write_inventory(tmp_path / "inv.yaml", {h: local_host(tmp_path / h, {})
                                                  for h in ("calm", "patched")})
    assert cli("ship", "--yes", inventory=inv, blueprint=bp).code == 0
    (tmp_path / "patched" / "current" / "runner" / "x.txt").write_text("hand\n")
    run = cli("drift", "--quiet", inventory=inv, blueprint=bp)
    assert run.code == 1
    assert "patched" in run.stdout and "calm" not in run.stdout
    assert "source:" not in run.stdout  # a clean source is not a problem
    full = cli("drift", inventory=inv, blueprint=bp)
    assert "calm: in sync" in full.stdout
