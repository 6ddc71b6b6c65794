"""Run tinygpt: ``torchrun --standalone --nproc-per-node 2 examples/tinygpt/train.py [flags]``.

Also runs as a single process (``python examples/tinygpt/train.py``), with data-parallel size 1.
See docs/tinygpt.md for the flags, the log format and the fault switches.
"""

import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: make the repository root importable instead of this folder.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parents[1]))

from examples.tinygpt.trainer import main  # noqa: E402

if __name__ == "__main__":
    rc = main()
    # Leave without interpreter finalisation: on CPU, a gloo worker thread that releases the last
    # reference to a tensor while Python finalises aborts the process ("terminate called without an
    # active exception") after a successful run. Everything is written and flushed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
