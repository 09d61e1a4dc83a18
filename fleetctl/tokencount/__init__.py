"""Counting tokens where fleetctl needs them below the ``tokens`` command: at render.

The desired tree carries each agent's exact prefix counts (``agents/<agent>/prefix-tokens.json``),
so rendering counts tokens; the ``fleetctl tokens`` command (:mod:`fleetctl.tokens`) builds on the
same pieces. One module per job:

- :mod:`fleetctl.tokencount.offline`       the exact, offline ``o200k_base`` encoder and its
  provenance
- :mod:`fleetctl.tokencount.counters`      the pluggable counters: offline o200k, the Claude
  estimate band, and Claude's ``count_tokens`` endpoint measured as deltas
- :mod:`fleetctl.tokencount.prefixmodule`  the blueprint's runner prefix builder, imported once
  per content
- :mod:`fleetctl.tokencount.prefix_counts` the ``prefix-tokens.json`` render writes per agent
"""
