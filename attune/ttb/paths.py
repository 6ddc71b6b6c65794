"""An entry carries no path of the machine it was submitted from.

A campaign records absolute paths: each run's `--run-dir` and backend id sit under the campaign
directory, and jobs run in a working directory (by default attune's source root). Submit rewrites them
in every file it copies into an entry:

- a path under the campaign directory becomes relative to it (`runs/r001-calibration`; the directory
  itself becomes `.`);
- attune's source root becomes `${ATTUNE_REPO}` (the user's own checkout);
- any other working directory becomes `${ATTUNE_WORKDIR}`.

`recipe/run.sh` changes into the working directory through the same variables, with the current
directory as the default where the campaign ran in attune's source root, and runs `$PYTHON`
(default `python` on PATH) where the campaign's script named its machine's interpreter. The ledger's rows are
rewritten the same way and their hash chain is rebuilt; the entry records the campaign's own ledger
head (`ledger.source_last_hash`) beside the rewritten one.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attune.core.containment import inside

REPO = "${ATTUNE_REPO}"
WORKDIR = "${ATTUNE_WORKDIR}"
# Every placeholder an entry may hold where a machine path was; documented in docs/ttb.md.
PLACEHOLDERS = (REPO, WORKDIR, "${RUN_DIR}")

_PATH_CHAR = r"[A-Za-z0-9._+-]"


class Relocator:
    """Rewrites the submitting machine's paths (longest prefix first) in strings, JSON and files."""

    def __init__(self, campaign_dir: Path, workdir: Path | None, source_root: Path) -> None:
        self.campaign_dir = Path(campaign_dir).absolute()
        self.workdir = Path(workdir).absolute() if workdir is not None else None
        self.source_root = Path(source_root).absolute()
        pairs: dict[str, Callable[[str], str]] = {}

        def add(p: Path, under: Callable[[str], str]) -> None:
            for form in {str(p), str(p.resolve())}:
                if form != "/":
                    pairs[form] = under

        add(self.source_root, lambda rest: REPO + rest)
        if self.workdir is not None and not self._under(self.workdir, self.campaign_dir) \
                and self.workdir.resolve() != self.source_root.resolve():
            add(self.workdir, lambda rest: WORKDIR + rest)
        add(self.campaign_dir, lambda rest: rest[1:] if rest else ".")
        self._pairs = sorted(pairs.items(), key=lambda kv: -len(kv[0]))
        alt = "|".join(re.escape(k) for k, _ in self._pairs)
        self._re = re.compile(rf"(?<!{_PATH_CHAR})({alt})((?:/{_PATH_CHAR}+)*/?)(?!{_PATH_CHAR})")
        self._map = dict(self._pairs)

    @staticmethod
    def _under(p: Path, root: Path) -> bool:
        return inside(p.resolve(), root.resolve())

    def text(self, s: str) -> str:
        def sub(m: re.Match[str]) -> str:
            rest = m.group(2).rstrip("/") if m.group(2) != "/" else ""
            return self._map[m.group(1)](rest)

        return self._re.sub(sub, s)

    def obj(self, o: Any) -> Any:
        if isinstance(o, str):
            return self.text(o)
        if isinstance(o, list):
            return [self.obj(x) for x in o]
        if isinstance(o, dict):
            return {self.text(k): self.obj(v) for k, v in o.items()}
        return o

    def json_file(self, src: Path) -> str:
        return json.dumps(self.obj(json.loads(src.read_text(encoding="utf-8"))), indent=2) + "\n"

    def ledger_file(self, src: Path) -> str:
        """The ledger with its rows' data rewritten and the hash chain rebuilt over them."""
        from attune.core import ledger

        out, prev = [], ledger.GENESIS
        for row in ledger.read(src.parent).rows:
            data = self.obj(row.data)
            h = ledger.row_hash(row.seq, row.ts, row.type, data, prev)
            out.append(ledger.canonical_line(ledger.Row(row.seq, row.ts, row.type, data, prev, h)).decode())
            prev = h
        return "".join(out)

    def cd_line(self) -> str:
        """run.sh's `cd` into the working directory, through the documented variables."""
        wd = self.workdir or self.source_root
        if wd.resolve() == self.source_root.resolve():
            return 'cd "${ATTUNE_REPO:-.}"'
        if self._under(wd, self.campaign_dir):
            rel = wd.resolve().relative_to(self.campaign_dir.resolve())
            return 'cd "${CAMPAIGN_DIR:-.}"' + ("" if str(rel) == "." else "/" + shlex.quote(str(rel)))
        return 'cd "${ATTUNE_WORKDIR:?set ATTUNE_WORKDIR to the directory the recipe runs in}"'

    def run_sh(self, src: Path) -> str:
        """shipped/run.sh with its `cd` and usage lines made portable and any other path rewritten."""
        wd = self.workdir or self.source_root
        cd_forms = {f"cd {shlex.quote(str(wd))}", f"cd {shlex.quote(str(wd.resolve()))}"}
        lines = []
        for line in src.read_text(encoding="utf-8").splitlines():
            if line in cd_forms:
                line = self.cd_line()
            elif line.startswith("PYTHON=${PYTHON:-"):  # the submitting machine's interpreter: the user's own
                line = "PYTHON=${PYTHON:-python}"
            elif line.startswith("# The interpreter the campaign's measured runs used"):
                line = ("# The interpreter: python on PATH, or set PYTHON; it needs the workload's packages "
                        "(campaign.yaml's environment)")
            elif line.startswith("# Usage:"):
                line = ("# Usage: ATTUNE_REPO=<your attune checkout> RUN_DIR=<output dir> sh run.sh"
                        if "ATTUNE_REPO" in self.cd_line() else
                        "# Usage: CAMPAIGN_DIR=<the campaign directory> RUN_DIR=<output dir> sh run.sh"
                        if "CAMPAIGN_DIR" in self.cd_line() else
                        "# Usage: ATTUNE_WORKDIR=<the recipe's working directory> RUN_DIR=<output dir> sh run.sh")
            elif not line.startswith("#!"):
                line = self.text(line)
            lines.append(line)
        return "\n".join(lines) + "\n"


# An absolute path: a slash after a non-path character, then at least two path segments.
ABS_PATH = re.compile(rf"(?<![A-Za-z0-9._+}}:/-])/{_PATH_CHAR}+(?:/{_PATH_CHAR}+)+")


def absolute_paths(text: str) -> list[str]:
    """The absolute paths in a file's text, leaving out run.sh's `#!/bin/sh` line."""
    found = []
    for i, line in enumerate(text.splitlines()):
        if i == 0 and line.startswith("#!"):
            continue
        found += ABS_PATH.findall(line)
    return found
