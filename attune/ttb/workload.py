"""The TTB workload: SFT conversations rendered with a model's chat template, packed into fixed rows.

Building (`build_rows`):

1. read conversations (`{"messages": [{"role", "content"}, ...]}` per line of a JSONL file, or the
   Tulu 3 SFT mixture through Hugging Face `datasets` where it can be downloaded: `load_tulu3`);
2. render each with the model's chat template (a Jinja2 template, as in a Hugging Face
   `tokenizer_config.json`), rendered in Jinja2's immutable sandbox the way `transformers` does;
3. tokenize the rendered text with the model's tokenizer (a `tokenizer.json` read by the
   `tokenizers` library, or the byte-level tokenizer of the local example model), with no
   beginning-of-sequence token, and end each conversation with the end-of-sequence token;
4. concatenate, and cut the stream into rows of exactly `seq_length` tokens (a conversation that
   does not fit spills over into the next row; the incomplete last row is dropped);
5. write `rows.u32` (little-endian uint32) and `manifest.json`: the sources' and tokenizer's
   hashes and one BLAKE2b-128 hash per row.

Reading (`Rows`): every row read is checked against the manifest's hash, and a row that does not
match is refused (`RowHashError`), so every run reads the same rows in the same order.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from attune.core.errors import TTBError

MANIFEST = "manifest.json"
ROWS_FILE = "rows.u32"
FORMAT = "ttb-rows-v1"
ROW_HASH = "blake2b-128 of the row's little-endian uint32 token ids"
DATA_DIR = Path(__file__).resolve().parent / "data"
SAMPLE_CONVERSATIONS = DATA_DIR / "sft_sample.jsonl"
SAMPLE_TOKENIZER = DATA_DIR / "tiny-chat-tokenizer"
TULU3_DATASET = "allenai/tulu-3-sft-mixture"
MAX_CONVERSATION_BYTES = 4 << 20  # a bound on one input line


class WorkloadError(TTBError, ValueError):
    """Input the workload builder cannot use (names the file and the problem)."""


class RowHashError(WorkloadError):
    """A row on disk is not the row the manifest describes: refused."""


# ---------------------------------------------------------------------------------- tokenizers


class Tokenizer(Protocol):
    name: str
    eos_id: int
    vocab_size: int
    sha256: str

    def encode(self, text: str) -> list[int]: ...


@dataclass
class ByteTokenizer:
    """The local example model's tokenizer: one token per UTF-8 byte, end of text = 256."""

    name: str = "bytes-257"
    eos_id: int = 256
    vocab_size: int = 257
    sha256: str = hashlib.sha256(b"attune byte tokenizer: utf-8 bytes 0..255, eos 256").hexdigest()
    eos_token: str = "<|endoftext|>"
    chat_template: str = (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class HFTokenizer:
    """A Hugging Face tokenizer directory: `tokenizer.json` (read by the `tokenizers` library) and
    `tokenizer_config.json` (its `chat_template` and `eos_token`)."""

    def __init__(self, directory: str | Path) -> None:
        d = Path(directory)
        try:
            from tokenizers import Tokenizer as _Tok
        except ImportError as exc:  # pragma: no cover - the ttb extra installs it
            raise WorkloadError("the `tokenizers` package is needed: pip install 'attune[ttb]'") from exc
        tj, tc = d / "tokenizer.json", d / "tokenizer_config.json"
        for p in (tj, tc):
            if not p.is_file():
                raise WorkloadError(f"tokenizer: no {p.name} in {d}")
        raw = tj.read_bytes()
        try:
            self._tok = _Tok.from_str(raw.decode("utf-8"))
            cfg = json.loads(tc.read_text(encoding="utf-8"))
        except Exception as exc:  # noqa: BLE001 - the library raises its own exception type
            raise WorkloadError(f"tokenizer: cannot load {d}: {exc}") from None
        template = cfg.get("chat_template")
        if isinstance(template, list):  # several named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str) or not template:
            raise WorkloadError(f"tokenizer: {tc} has no chat_template")
        eos = cfg.get("eos_token")
        if isinstance(eos, dict):
            eos = eos.get("content")
        if not isinstance(eos, str):
            raise WorkloadError(f"tokenizer: {tc} has no eos_token")
        eos_id = self._tok.token_to_id(eos)
        if eos_id is None:
            raise WorkloadError(f"tokenizer: eos_token {eos!r} is not in the vocabulary")
        self.name = str(cfg.get("name_or_path") or d.name)
        self.chat_template = template
        self.eos_token = eos
        self.bos_token = cfg.get("bos_token") if isinstance(cfg.get("bos_token"), str) else ""
        self.eos_id = int(eos_id)
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.sha256 = hashlib.sha256(raw + b"\0" + tc.read_bytes()).hexdigest()

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def load_tokenizer(spec: str | Path) -> ByteTokenizer | HFTokenizer:
    """`bytes` (the local example model's), or a directory holding a Hugging Face tokenizer."""
    if str(spec) == "bytes":
        return ByteTokenizer()
    return HFTokenizer(spec)


# ---------------------------------------------------------------------------------- chat template


def render(template: str, messages: list[Mapping[str, str]], *, eos_token: str = "", bos_token: str = "") -> str:
    """Render one conversation with a Hugging Face-style chat template, in Jinja2's sandbox."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=False, eos_token=eos_token, bos_token=bos_token)
    except TemplateError as exc:
        raise WorkloadError(f"chat template: {exc}") from None


# ---------------------------------------------------------------------------------- conversations


def _check_messages(obj: Any, where: str) -> list[dict[str, str]]:
    msgs = obj.get("messages") if isinstance(obj, dict) else None
    if not isinstance(msgs, list) or not msgs:
        raise WorkloadError(f"{where}: messages: expected a non-empty list")
    out = []
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise WorkloadError(f"{where}: messages[{i}]: expected {{role: str, content: str}}")
        if m["role"] not in ("system", "user", "assistant", "tool"):
            raise WorkloadError(f"{where}: messages[{i}].role: unknown role {m['role']!r}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def read_jsonl(path: str | Path) -> Iterator[list[dict[str, str]]]:
    """Conversations from a JSONL file in the Tulu 3 layout (one `{"messages": [...]}` per line)."""
    p = Path(path)
    try:
        fh = p.open("rb")
    except OSError as exc:
        raise WorkloadError(f"{p}: cannot read: {exc.strerror}") from None
    with fh:
        for n, line in enumerate(fh, 1):
            if len(line) > MAX_CONVERSATION_BYTES:
                raise WorkloadError(f"{p}:{n}: line longer than {MAX_CONVERSATION_BYTES} bytes")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise WorkloadError(f"{p}:{n}: not JSON: {exc}") from None
            yield _check_messages(obj, f"{p}:{n}")


def load_tulu3(split: str = "train") -> Iterator[list[dict[str, str]]]:  # pragma: no cover - needs the network
    """The Tulu 3 SFT mixture through Hugging Face `datasets`, streamed in its published order."""
    try:
        from datasets import load_dataset
    except ImportError as exc:
        raise WorkloadError("reading the Tulu 3 mixture needs the `datasets` package") from exc
    for i, obj in enumerate(load_dataset(TULU3_DATASET, split=split, streaming=True)):
        yield _check_messages(obj, f"{TULU3_DATASET}[{i}]")


# ---------------------------------------------------------------------------------- rows


def row_hash(row: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(row, dtype="<u4").tobytes(), digest_size=16).hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class BuildResult:
    out: Path
    num_rows: int
    conversations: int
    tokens_sha256: str


def pack(conversations: Iterable[list[dict[str, str]]], tok: Any, template: str, seq_length: int,
         num_rows: int | None, *, repeat: bool = False) -> tuple[np.ndarray, int]:
    """Token rows of exactly `seq_length` and the number of conversations used. With `repeat`, a
    source shorter than `num_rows` rows is read again from its start (the small committed sample)."""
    if seq_length <= 0:
        raise WorkloadError(f"seq_length: must be positive, got {seq_length}")
    stream: list[int] = []
    used = 0
    need = None if num_rows is None else num_rows * seq_length
    convs = list(conversations) if repeat else conversations
    while True:
        before = used
        for msgs in convs:
            text = render(template, msgs, eos_token=getattr(tok, "eos_token", ""),
                          bos_token=getattr(tok, "bos_token", "") or "")
            stream += tok.encode(text)
            stream.append(tok.eos_id)
            used += 1
            if need is not None and len(stream) >= need:
                break
        if not repeat or (need is not None and len(stream) >= need) or used == before:
            break
    n = len(stream) // seq_length if num_rows is None else min(num_rows, len(stream) // seq_length)
    if num_rows is not None and n < num_rows:
        raise WorkloadError(f"the source gives {n} rows of {seq_length} tokens, {num_rows} are needed")
    if n == 0:
        raise WorkloadError(f"the source gives no complete row of {seq_length} tokens")
    arr = np.asarray(stream[: n * seq_length], dtype=np.uint32).reshape(n, seq_length)
    if int(arr.max()) >= tok.vocab_size:
        raise WorkloadError(f"token id {int(arr.max())} outside the vocabulary ({tok.vocab_size})")
    return arr, used


def build_rows(out: str | Path, *, tokenizer: str | Path, seq_length: int, num_rows: int | None,
               conversations: str | Path | None = None, repeat: bool = False,
               protocol: str | None = None) -> BuildResult:
    """Render, tokenize, pack and write the rows and their manifest. `conversations`: a JSONL file,
    or None for the Tulu 3 SFT mixture (needs `datasets` and the network)."""
    tok = load_tokenizer(tokenizer)
    if conversations is None:
        source: dict[str, Any] = {"dataset": TULU3_DATASET, "split": "train", "order": "published"}
        convs: Iterable[list[dict[str, str]]] = load_tulu3()
    else:
        cp = Path(conversations)
        source = {"file": cp.name, "sha256": _sha256_file(cp) if cp.is_file() else None, "order": "file"}
        convs = read_jsonl(cp)
    rows, used = pack(convs, tok, tok.chat_template, seq_length, num_rows, repeat=repeat)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = rows.astype("<u4").tobytes()
    manifest = {
        "format": FORMAT, "protocol": protocol, "seq_length": seq_length, "num_rows": int(rows.shape[0]),
        "tokens_file": ROWS_FILE, "tokens_dtype": "<u4", "tokens_sha256": hashlib.sha256(raw).hexdigest(),
        "row_hash": ROW_HASH,
        "source": {**source, "conversations_used": used, "repeated": bool(repeat)},
        "tokenizer": {"name": tok.name, "sha256": tok.sha256, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id},
        "chat_template_sha256": hashlib.sha256(tok.chat_template.encode()).hexdigest(),
        "packing": "conversations rendered with the chat template, each followed by the end-of-sequence token, "
                   "concatenated and cut into rows of exactly seq_length tokens; no beginning-of-sequence token",
        "row_hashes": [row_hash(r) for r in rows],
    }
    _atomic(out_dir / ROWS_FILE, raw)
    _atomic(out_dir / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    return BuildResult(out_dir, int(rows.shape[0]), used, manifest["tokens_sha256"])


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def manifest_sha256(directory: str | Path) -> str:
    return _sha256_file(Path(directory) / MANIFEST)


class Rows:
    """The rows of a built workload, read in manifest order; each read is checked against its hash."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        try:
            m = json.loads((self.dir / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise WorkloadError(f"{self.dir / MANIFEST}: cannot read: {exc}") from None
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise WorkloadError(f"{self.dir / MANIFEST}: format: expected {FORMAT!r}")
        self.manifest = m
        self.seq_length = int(m["seq_length"])
        self.num_rows = int(m["num_rows"])
        self.hashes: list[str] = list(m["row_hashes"])
        if len(self.hashes) != self.num_rows:
            raise WorkloadError(f"{self.dir / MANIFEST}: row_hashes lists {len(self.hashes)} rows, num_rows "
                                f"says {self.num_rows}")
        path = self.dir / str(m["tokens_file"])
        size = path.stat().st_size if path.is_file() else -1
        if size != self.num_rows * self.seq_length * 4:
            raise WorkloadError(f"{path}: {size} bytes, the manifest describes {self.num_rows} rows of "
                                f"{self.seq_length} uint32 tokens")
        self._data = np.memmap(path, dtype="<u4", mode="r", shape=(self.num_rows, self.seq_length))

    def __len__(self) -> int:
        return self.num_rows

    def row(self, i: int) -> np.ndarray:
        """Row `i` of the manifest order (refused if its hash does not match)."""
        if not 0 <= i < self.num_rows:
            raise WorkloadError(f"row {i} outside 0..{self.num_rows - 1}")
        r = np.array(self._data[i])
        got = row_hash(r)
        if got != self.hashes[i]:
            raise RowHashError(f"row {i}: hash {got} does not match the manifest's {self.hashes[i]}: refused")
        return r

    def batches(self, global_batch: int, steps: int) -> Iterator[np.ndarray]:
        """The first steps x global_batch rows in manifest order, one step's rows at a time."""
        if steps * global_batch > self.num_rows:
            raise WorkloadError(f"{steps} steps of {global_batch} rows need {steps * global_batch} rows, "
                                f"the workload has {self.num_rows}")
        for s in range(steps):
            yield np.stack([self.row(s * global_batch + j) for j in range(global_batch)])

    def verify(self) -> int:
        """Check every row; returns how many."""
        for i in range(self.num_rows):
            self.row(i)
        return self.num_rows


def export_tinygpt(rows: Rows, out: str | Path) -> Path:
    """The rows in tinygpt's packed format (tokens.u16 + manifest.json), for the local protocol: row j
    is the TTB row j followed by the first token of row j+1 (its last label), as tinygpt reads rows."""
    vocab = int(rows.manifest["tokenizer"]["vocab_size"])
    if vocab > 65535:
        raise WorkloadError(f"tinygpt reads uint16 tokens; this vocabulary has {vocab} ids")
    s = rows.seq_length
    allrows = np.concatenate([rows.row(i) for i in range(rows.num_rows)])
    stream = np.concatenate([allrows, np.asarray([rows.manifest["tokenizer"]["eos_id"]], dtype=np.uint32)])
    toks = stream.astype("<u2")
    n = rows.num_rows
    starts = [j * s for j in range(n)]
    hashes = [hashlib.blake2b(np.ascontiguousarray(toks[a:a + s + 1]).tobytes(), digest_size=8).hexdigest()
              for a in starts]
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = toks.tobytes()
    manifest = {
        "format": "tinygpt-packed-v1",
        "tokenizer": {"type": "ByteLevel", "vocab_size": vocab, "eot_id": int(rows.manifest["tokenizer"]["eos_id"])},
        "tokens_file": "tokens.u16", "tokens_dtype": "<u2", "num_tokens": int(len(toks)),
        "tokens_sha256": hashlib.sha256(raw).hexdigest(),
        "source": {"ttb_manifest_sha256": manifest_sha256(rows.dir), "ttb_format": FORMAT},
        "packings": {str(s): {"num_rows": n, "row_tokens": s + 1, "row_start": starts, "row_hash": hashes}},
    }
    _atomic(out_dir / "tokens.u16", raw)
    _atomic(out_dir / "manifest.json", (json.dumps(manifest) + "\n").encode())
    return out_dir
