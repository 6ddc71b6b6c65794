"""A ledger writer process for the crash tests (not a test module).

usage: python ledger_writer.py DIR COUNT PAD [--tear]

Appends COUNT `diagnosis_recorded` rows (each padded with PAD bytes) and prints
"ack <seq>" after each append returns, i.e. once the row is durable. With --tear it then
writes half of a row by hand and kills itself mid-line, as a crash inside write() would.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attune.core.ledger import LEDGER_NAME, Ledger  # noqa: E402


def main() -> None:
    d, count, pad = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    led = Ledger(d)
    for i in range(count):
        row = led.append("diagnosis_recorded", {"text": f"pid {os.getpid()} row {i}", "pad": "x" * pad})
        sys.stdout.write(f"ack {row.seq} {row.hash}\n")
        sys.stdout.flush()
    if "--tear" in sys.argv:
        with open(Path(d) / LEDGER_NAME, "ab") as fh:
            fh.write(b'{"seq": 999999, "ts": "torn", "type": "diagnosis_recorded", "da')
            fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
