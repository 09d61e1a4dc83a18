"""Benchmark: fleetctl ship against rsync on the same tree, measured in the same run.

Run by hand (not part of the test suite; these machines are shared and noisy)::

    .venv/bin/python benchmarks/ship_vs_rsync.py [--files 2000] [--repeat 3] [--ssh]

Builds a blueprint of N files of 1-10 KB (a git repo), then times, median of ``--repeat``:
a cold ship to an empty root, a ship after one file changed, and a no-change ship; against
``rsync -a --delete`` doing the same (cold, one change, no change). With ``--ssh`` both go
through a real sshd on 127.0.0.1 (started here, as in the tests) instead of the local transport.
Prints seconds and the ratio fleetctl/rsync (lower is better for fleetctl). Note fleetctl does
more per run than rsync: it hashes every file (sha256) for the three-way plan, verifies the
staged release, and writes a full new release instead of updating in place.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import cli, make_project, write_inventory  # noqa: E402


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ssh", action="store_true", help="go through a real local sshd")
    args = parser.parse_args()
    if not shutil.which("rsync"):
        print("rsync is not installed (apt-get install rsync)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="fleetctl-bench-"))
    rng = random.Random(1)
    files: dict = {"runner": {}}
    for i in range(args.files):
        files["runner"].setdefault(f"d{i % 40}", {})[f"f{i}.txt"] = os.urandom(
            rng.randint(1024, 10240)).hex()[: rng.randint(1024, 10240)]
    bp = make_project(work, files)
    box = None
    rsync_ssh: list[str] = []
    if args.ssh:
        from tests.sshd_boxes import ensure_sshd_prerequisites, make_client_key, start_box, write_known_hosts
        ensure_sshd_prerequisites()
        key = make_client_key(work / "key")
        box = start_box(work, "bench", authorized={"root": key})
        kh = write_known_hosts(work / "known_hosts", [box])
        host = {"transport": "ssh", "address": "127.0.0.1", "port": box.port, "user": "root",
                "identity_file": str(key.private_key), "known_hosts": str(kh)}
        rsync_ssh = ["-e", f"ssh -p {box.port} -i {key.private_key} -o UserKnownHostsFile={kh} "
                     "-o StrictHostKeyChecking=yes"]
    else:
        host = {"transport": "local"}
    results: dict[str, list[tuple[float, float]]] = {"cold": [], "one change": [], "no change": []}
    try:
        for r in range(args.repeat):
            root = work / f"box{r}"
            inv = write_inventory(work / "inv.yaml", {"h": {**host, "root": str(root),
                                                          "agents": {"w": {"role": "worker"}}}})
            dest = work / f"rsync{r}"
            src = str(bp / "runner") + "/"
            target = (f"root@127.0.0.1:{dest}/" if args.ssh else f"{dest}/")

            def ship():
                run = cli("ship", "--yes", "--format", "json", inventory=inv, blueprint=bp)
                assert run.code == 0, run.stdout + run.stderr

            def rsync():
                subprocess.run(["rsync", "-a", "--delete", *rsync_ssh, src, target], check=True)

            dest.mkdir()
            results["cold"].append((timed(ship), timed(rsync)))
            changed = bp / "runner" / "d0" / "f0.txt"
            changed.write_text(f"changed {r}\n")
            subprocess.run(["git", "-C", str(bp), "commit", "-qam", "c"], check=True,
                           env={**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x",
                                "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x"})
            results["one change"].append((timed(ship), timed(rsync)))
            results["no change"].append((timed(ship), timed(rsync)))
    finally:
        if box is not None:
            box.stop()
    via = "ssh" if args.ssh else "local"
    print(f"{args.files} files of 1-10 KB, {via}, median of {args.repeat}")
    print(f"{'case':<12} {'fleetctl s':>11} {'rsync s':>9} {'ratio':>7}")
    for case, pairs in results.items():
        f = statistics.median(p[0] for p in pairs)
        r = statistics.median(p[1] for p in pairs)
        print(f"{case:<12} {f:>11.3f} {r:>9.3f} {f / r:>7.1f}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
