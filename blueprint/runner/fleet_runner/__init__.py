"""fleet_runner: the loop each agent runs on its host (DESIGN.md §7).

Standard library only: hosts get no pip installs. One module per job:

- :mod:`fleet_runner.config`     the agent's config (``agents/<name>/agent.yaml``)
- :mod:`fleet_runner.paths`      where the release, state and workspace are
- :mod:`fleet_runner.inbox`      the message spool: claim, parse, finish
- :mod:`fleet_runner.names`      a task id's file-name form (``:`` would split the agent's
                                  PATH) and the one-line form of text in a log line
- :mod:`fleet_runner.tokens`     token numbers for the host-side ledger: fleetctl's exact
                                  render-time ``o200k_base`` counts (``prefix-tokens.json``) when
                                  they describe the prefix built here, else a labelled estimate
                                  (``bytes/4-estimate``: hosts get no pip installs)
- :mod:`fleet_runner.prefix`     the prompt prefix (also imported by ``fleetctl tokens``)
- :mod:`fleet_runner.prompt`     the task prompt: message, anti-silence, retry feedback
- :mod:`fleet_runner.mcpconfig`  the role's ``via: mcp`` servers, written per attempt into the
                                  MCP config file ``{mcp_config}`` names in the agent command
- :mod:`fleet_runner.invoke`     a command in its own process group, with a wall-clock timeout
- :mod:`fleet_runner.cgroup`     a cgroup per run, where the host offers one
- :mod:`fleet_runner.snapshot`   sha256 snapshots of the workspace and their difference
- :mod:`fleet_runner.checkparse` checker output (``path:line:col: msg`` ...) parsed, and each
                                  printed path placed in the workspace
- :mod:`fleet_runner.gates`      the verify gates: run, checks (diff-aware), anti-silence, scope
- :mod:`fleet_runner.agentresult` the agent CLI's own result and transcript: is_error, denials
- :mod:`fleet_runner.standing`   standing denials: no new task until a person clears them
- :mod:`fleet_runner.scope`      the ``writes`` patterns (a gitignore subset) of the scope gate
- :mod:`fleet_runner.undo`       undoing a run's changes outside its scope, read back
- :mod:`fleet_runner.scoperequest` asking for more write scope, decided by rules
- :mod:`fleet_runner.reposync`   the working-repository sync before a task (and undoing one a
                                  crash cut short), the in-progress sentinel, what a task left
                                  uncommitted, and the files its commits changed
- :mod:`fleet_runner.calls`      shims first on the agent's PATH counting its CLI and MCP calls
- :mod:`fleet_runner.evidence`   what the CLIs record for the runner: sends and denials
- :mod:`fleet_runner.sendproof`  with two users, sends recorded through the runner's socket
- :mod:`fleet_runner.stateowner` with two users, who owns what in the state directory
- :mod:`fleet_runner.records`    JSON files and the JSONL ledger, written safely
- :mod:`fleet_runner.progress`   the per-task sentinel that makes restarts safe
- :mod:`fleet_runner.escalate`   telling a person, through the notify CLI
- :mod:`fleet_runner.loop`       the outer loop: take a task, attempt, verify, retry, finish
- :mod:`fleet_runner.cli`        the command line

Importing any module has no side effects.
"""

__version__ = "0.1.0"
