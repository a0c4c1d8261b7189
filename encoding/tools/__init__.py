"""encoding.tools: the logic behind the command-line tools in ``scripts/`` (the scripts stay thin).

* :mod:`encoding.tools.memory_balance` — peak memory per device of a training step under each data-parallel
  strategy, simulated or measured (``scripts/memory_balance.py``).
"""
