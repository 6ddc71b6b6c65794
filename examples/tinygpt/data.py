"""tinygpt's data: the committed, hash-checked token rows (see build_data.py for the format)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_DATA_PATH = Path(__file__).resolve().parent / "data"


class DataError(RuntimeError):
    """The data on disk is not the data the manifest describes (or the request is impossible)."""


def row_hash(row: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(row, dtype="<u2").tobytes(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class DataInfo:
    path: str
    tokens_sha256: str
    num_tokens: int
    num_rows: int
    vocab_size: int
    eot_id: int


class PackedRows:
    """Rows of ``seq_length + 1`` tokens in a fixed order; every read is checked against its hash.

    Sample ``i`` (0-based, counted over the whole run: sample ``k * global_batch + j`` is row ``j``
    of step ``k``) is row ``i mod num_rows`` of the order; the order wraps around after one epoch.
    """

    def __init__(self, path: str | Path, seq_length: int):
        self.path = Path(path)
        mpath = self.path / "manifest.json"
        try:
            manifest = json.loads(mpath.read_text())
        except FileNotFoundError as e:
            raise DataError(f"data manifest not found: {mpath}") from e
        except json.JSONDecodeError as e:
            raise DataError(f"data manifest {mpath} is not valid JSON: {e}") from e
        packing = manifest["packings"].get(str(seq_length))
        if packing is None:
            have = ", ".join(sorted(manifest["packings"], key=int))
            raise DataError(
                f"seq_length {seq_length} has no packed rows in {mpath} (have {have}); "
                "add it to SEQ_LENGTHS in examples/tinygpt/build_data.py and rebuild"
            )
        tpath = self.path / manifest["tokens_file"]
        raw = tpath.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        if digest != manifest["tokens_sha256"]:
            raise DataError(
                f"token file {tpath} has sha256 {digest}, manifest says {manifest['tokens_sha256']}: "
                "the data changed; rebuild it with examples/tinygpt/build_data.py"
            )
        self.tokens = np.frombuffer(raw, dtype=manifest["tokens_dtype"])
        self.seq_length = seq_length
        self.row_start = np.asarray(packing["row_start"], dtype=np.int64)
        self.row_hashes: list[str] = packing["row_hash"]
        if len(self.row_start) != packing["num_rows"] or len(self.row_hashes) != packing["num_rows"]:
            raise DataError(f"{mpath}: packing {seq_length} lists a wrong number of rows")
        tok = manifest["tokenizer"]
        self.info = DataInfo(
            path=str(self.path),
            tokens_sha256=digest,
            num_tokens=len(self.tokens),
            num_rows=int(packing["num_rows"]),
            vocab_size=int(tok["vocab_size"]),
            eot_id=int(tok["eot_id"]),
        )

    def __len__(self) -> int:
        return self.info.num_rows

    def row(self, sample: int) -> np.ndarray:
        j = sample % self.info.num_rows
        a = int(self.row_start[j])
        row = self.tokens[a:a + self.seq_length + 1]
        got = row_hash(row)
        if len(row) != self.seq_length + 1 or got != self.row_hashes[j]:
            raise DataError(
                f"data row hash mismatch: sample {sample} (row {j}, tokens {a}..{a + self.seq_length}) "
                f"hashes to {got}, manifest says {self.row_hashes[j]}"
            )
        return row.astype(np.int64)

    def verify(self, samples: range) -> None:
        """Check every row a run will read, before it starts (raises DataError on a mismatch)."""
        for j in sorted({i % self.info.num_rows for i in samples}):
            self.row(j)

    def rows(self, samples: range | list[int]) -> np.ndarray:
        return np.stack([self.row(i) for i in samples])
