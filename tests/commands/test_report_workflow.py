"""The CI recipe's own commands against sshd boxes.

The ``run:`` steps of ``.github/workflows/nightly-drift.yml`` are taken from the YAML and run
in order with bash as GitHub runs them (``bash --noprofile --norc -eo pipefail``), in a git
checkout of a test project, with the environment the workflow gives each step: its ``env:``
block with ``${{ secrets.* }}`` (the test's SSH key and known_hosts), ``${{ vars.* || 'default'
}}`` and ``${{ steps.*.outputs.* }}`` evaluated, and ``GITHUB_OUTPUT`` / ``GITHUB_STEP_SUMMARY``
files. Only the install step is left out (fleetctl is installed in this environment already);
the ``uses:`` steps (checkout, cache, upload) are GitHub's own. Two nights: the first fails on a
hand-patch; the second, with ``FLEET_FAIL_ON=new`` and the history kept, passes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from junitparser import Failure, JUnitXml

from tests.helpers import cli, make_project, ssh_host, write_inventory

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "nightly-drift.yml"
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def evaluate(text: str, secrets: dict, variables: dict, outputs: dict) -> str:
    """The few expression forms the workflow's env blocks use; anything else fails the test."""

    def one(m: re.Match) -> str:
        expr = m.group(1)
        if (s := re.fullmatch(r"secrets\.(\w+)", expr)):
            return secrets[s.group(1)]
        if (s := re.fullmatch(r"vars\.(\w+)\s*\|\|\s*'([^']*)'", expr)):
            return variables.get(s.group(1)) or s.group(2)
        if (s := re.fullmatch(r"steps\.(\w+)\.outputs\.(\w+)", expr)):
            return outputs.get(s.group(1), {}).get(s.group(2), "")
        raise AssertionError(f"the test does not evaluate ${{{{ {expr} }}}}")

    return EXPR.sub(one, str(text))


def run_workflow(checkout: Path, home: Path, secrets: dict, variables: dict,
                 tmp: Path) -> list[tuple[str, int, str]]:
    """Run the job's run steps; return (name, exit status, output) per step run."""
    job = yaml.safe_load(WORKFLOW.read_text())["jobs"]["report"]
    outputs: dict[str, dict[str, str]] = {}
    summary = tmp / "step-summary.md"
    summary.write_text("")
    venv_bin = str(Path(sys.executable).parent)
    ran: list[tuple[str, int, str]] = []
    failed = False
    for i, step in enumerate(job["steps"]):
        if "run" not in step or step.get("name", "").startswith("Install"):
            continue
        condition = str(step.get("if", "success()"))
        if failed and "always()" not in condition:
            continue
        for text in [step["run"]]:
            assert "${{" not in text, f"{step['name']}: expressions belong in env"
        out_file = tmp / f"output-{i}"
        out_file.write_text("")
        env = {"HOME": str(home), "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
               "LANG": "C.UTF-8", "GITHUB_OUTPUT": str(out_file),
               "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_WORKSPACE": str(checkout),
               "RUNNER_TEMP": str(tmp), "CI": "true"}
        for k, v in (step.get("env") or {}).items():
            env[k] = evaluate(v, secrets, variables, outputs)
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                               step["run"]], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL)
        ran.append((step["name"], done.returncode, done.stdout + done.stderr))
        if "id" in step:
            outputs[step["id"]] = dict(line.split("=", 1) for line in
                                       out_file.read_text().splitlines() if "=" in line)
        failed = failed or done.returncode != 0
    return ran


def test_workflow_commands_against_sshd_boxes(tmp_path, sshd_pool, ssh_client_key,
                                              ssh_known_hosts, isolated_user):
    checkout = tmp_path / "checkout"
    bp = make_project(checkout, {"runner": {"a.txt": "a\n", "b.txt": "b\n"}})
    roots = {f"box{i}": tmp_path / f"root{i}" for i in range(2)}
    # Ship first, with the test's own key paths.
    ship_inv = write_inventory(tmp_path / "ship.yaml", {
        name: ssh_host(sshd_pool[i], ssh_client_key, ssh_known_hosts, roots[name], agents={})
        for i, name in enumerate(roots)})
    shipped = cli("ship", "--yes", "--format", "json", inventory=ship_inv, blueprint=bp)
    assert shipped.code == 0, shipped.stdout + shipped.stderr
    # The fleet's inventory as docs/ci.md describes it: the key and known_hosts under ~/.ssh,
    # written there by the workflow from its secrets.
    (checkout / "inventory").mkdir()
    hosts = {}
    for i, name in enumerate(roots):
        h = ssh_host(sshd_pool[i], ssh_client_key, ssh_known_hosts, roots[name], agents={})
        h["identity_file"] = "~/.ssh/fleetctl_ci"
        h["known_hosts"] = "~/.ssh/fleetctl_known_hosts"
        hosts[name] = h
    write_inventory(checkout / "inventory" / "fleet.yaml", hosts)
    (roots["box0"] / "current" / "runner" / "a.txt").write_text("patched on the box\n")
    secrets = {"FLEET_SSH_KEY": ssh_client_key.private_key.read_text(),
               "FLEET_KNOWN_HOSTS": ssh_known_hosts.read_text()}
    assert not (isolated_user / ".ssh" / "fleetctl_ci").exists()

    night1 = run_workflow(checkout, isolated_user, secrets, {}, tmp_path)
    assert [(n, c) for n, c, _ in night1] == [
        ("Load the SSH key and known_hosts", 0), ("Nightly report", 0),
        ("Publish the summary", 0), ("Fail on the findings chosen", 1)], night1
    key_file = isolated_user / ".ssh" / "fleetctl_ci"
    assert key_file.stat().st_mode & 0o077 == 0
    reports = checkout / "reports"
    assert sorted(p.name for p in reports.iterdir()) == [
        "junit.xml", "report.html", "report.json", "report.md"]
    xml = JUnitXml.fromfile(str(reports / "junit.xml"))
    failing = {(s.name, c.name) for s in xml for c in s
               if any(isinstance(r, Failure) for r in c.result)}
    assert failing == {("fleetctl report: drift", "box0")}
    summary = (tmp_path / "step-summary.md").read_text()
    assert summary == (reports / "report.md").read_text() and "box0" in summary
    log = night1[1][2]
    assert "runner/a.txt" in log and "box1" not in log  # --quiet: only what fails
    assert secrets["FLEET_SSH_KEY"].strip().splitlines()[1] not in "".join(
        o for _, _, o in night1)  # the key is never printed
    assert len(list((checkout / ".fleet-history").iterdir())) == 1

    # Night 2: the same hand-patch, the operator fails on new findings only.
    night2 = run_workflow(checkout, isolated_user, secrets, {"FLEET_FAIL_ON": "new"}, tmp_path)
    assert [(n, c) for n, c, _ in night2][-1] == ("Fail on the findings chosen", 0), night2
    import json

    doc = json.loads((reports / "report.json").read_text())
    assert [(f["host"], f["subject"], f["state"], f["fails"]) for f in doc["findings"]] == [
        ("box0", "runner/a.txt", "persisting", False)]

    # No secrets: the job stops at once, saying which.
    broken = run_workflow(checkout, isolated_user, {"FLEET_SSH_KEY": "", "FLEET_KNOWN_HOSTS": ""},
                          {}, tmp_path)
    assert broken[0][:2] == ("Load the SSH key and known_hosts", 2)
    assert "FLEET_SSH_KEY" in broken[0][2]
    assert [n for n, _, _ in broken] == ["Load the SSH key and known_hosts",
                                        "Publish the summary"]
    # Last night's summary is not published as tonight's.
    assert (tmp_path / "step-summary.md").read_text() == \
        "The nightly report did not run: see the job's log.\n"
