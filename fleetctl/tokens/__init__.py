"""``fleetctl tokens``: measure every agent's prompt prefix, hold it to budgets, and cut it.

The prompt prefix (DESIGN.md §2) is re-sent on every turn, so its size is paid again and again.
This package measures it with the runner's own prefix builder (docs/invariants.md, invariant 9),
counts it with a tokenizer whose provenance is printed in every report, and checks it against the
budgets the roles declare. One module per job:

- :mod:`fleetctl.tokens.mcp_list`  listing an MCP server's tools: over stdio, or from a snapshot
- :mod:`fleetctl.tokens.models`    per-model facts: context window, tool-use system prompt
- :mod:`fleetctl.tokens.measure`   a prefix's components, its total and each tool's marginal cost
- :mod:`fleetctl.tokens.audit`     the library function behind the command: agents, budgets,
  ``--compare mcp``, ``--baseline``
- :mod:`fleetctl.tokens.live`      ``--live``: the runners' ledgers read from the hosts, per agent
- :mod:`fleetctl.tokens.deadweight` ``--live``: declared CLIs and MCP tools against those called

Below it, in the core: the role settings this command reads (MCP servers, ceilings) are
:mod:`fleetctl.roledecl`, validated with the blueprint; the offline encoder and the counters are
:mod:`fleetctl.tokencount`, which render uses for each agent's ``prefix-tokens.json``. The report's
text, JSON and Markdown are rendered in the CLI layer (:mod:`fleetctl.cli.output.tokens`).
"""
