#!/usr/bin/env python3
"""Helper script of the attune tuning skill; see SKILL.md. Run: python3 memory.py --help"""

import sys
from pathlib import Path

# The plugin root holds the attune package; the script needs only the standard library and PyYAML.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from attune.knowledge.skilltools import memory_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(memory_main())
