"""The gate's evaluation harness: a side product that measures the gate, never part of a campaign's run.

- :mod:`gate.evaluation.validate`: tinygpt runs whose answer is known (``attune gate validate``).
- :mod:`gate.evaluation.component`: component tests of same-math swaps (``attune gate component``).
- :mod:`gate.evaluation.realcurves`: both verdicts on public real loss curves
  (``python -m gate.evaluation.realcurves``).

It imports the gate's runtime (lists, layer 1, layer 2, the judge); the runtime never imports it
(`tests/test_layering.py` holds both directions). Its data collectors live beside their data in
`tests/data/real_curves*/collect.py`.
"""
