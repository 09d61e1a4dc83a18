"""The ``fleetctl`` command line: a thin typer layer over the library, one module per command
group.

- :mod:`fleetctl.cli.drift`     ``drift``, ``ship``, ``render``
- :mod:`fleetctl.cli.creds`     ``creds audit``
- :mod:`fleetctl.cli.releases`  ``releases``, ``rollback``, ``history``, ``backport``
- :mod:`fleetctl.cli.report`    ``report``, ``status``
- :mod:`fleetctl.cli.tokens`    ``tokens``
- :mod:`fleetctl.cli.common`    what they share: options, the stderr console, loading the project,
  progress, where the report goes, and :func:`~fleetctl.cli.common.guard`, the one way out
- :mod:`fleetctl.cli.output`    every renderer: text, Markdown, JSON documents, HTML, JUnit

Each command loads its input, calls one library function, renders the results and exits with the
code DESIGN.md §4 gives. Errors become a message and an exit code here and nowhere else. Data
goes to stdout (or ``--output``); messages, progress and prompts go to stderr. Nothing below this
package imports it, typer or rich (docs/design.md, *Layers*; checked by ``lint-imports``).
"""

from __future__ import annotations

import sys

import typer

from fleetctl import __version__
from fleetctl.cli import creds, drift, releases, report, tokens

app = typer.Typer(
    name="fleetctl",
    help="Keep a fleet of AI-agent hosts identical to one blueprint.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

drift.register(app)
tokens.register(app)
releases.register(app)
creds.register(app)
report.register(app)


@app.command()
def version() -> None:
    """Print fleetctl's version."""
    typer.echo(__version__)


def main() -> None:
    """Console-script entry point.

    ``--force=PATH`` (with ``=``) is read as ``--force-path PATH``: overwrite that path's
    hand-patch only. ``--force PATH`` cannot mean that, since ``--force`` alone overwrites all
    and a following word is a host (docs/design.md (r)).
    """
    sys.argv[1:] = [f"--force-path={arg[len('--force='):]}" if arg.startswith("--force=")
                    else arg for arg in sys.argv[1:]]
    app()
