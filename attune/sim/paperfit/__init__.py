"""The simulator's fit to the ATTUNE paper: a side product that calibrates `attune.sim`, never used by it.

- :mod:`attune.sim.paperfit.paper`: the paper's measured points (tables, splits, the tuners' rows).
- :mod:`attune.sim.paperfit.fit`: each point's simulated value and its error (`evaluate`, `summarise`).

`benchmarks/fit_sim.py` fits `attune.sim.constants` on them; `tests/test_sim_paperfit.py` holds the
held-out errors to their bounds. The simulator and every runtime layer never import this package
(`tests/test_layering.py`).
"""
