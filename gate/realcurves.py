"""Forwarding module: `python -m gate.realcurves` runs its successor, `python -m gate.evaluation.realcurves`.

Kept so the documented command keeps working; nothing imports this module (the code lives in
`gate/evaluation/realcurves.py`, a side product the gate's runtime never imports).
"""

from __future__ import annotations

if __name__ == "__main__":
    import runpy

    runpy.run_module("gate.evaluation.realcurves", run_name="__main__", alter_sys=True)
