"""A strict reader for one shell command line, for the PreToolUse policy.

The policy never asks a shell what a command means: it reads the line itself and refuses
everything whose meaning depends on an expansion. `pipeline(line)` returns the stages of a
pipeline (`a | b | c`), each the words of one simple command (quotes removed) and its
redirections; `lex(line)` reads one simple command. Both raise `Refused` with the reason.

Refused outright, wherever they appear unquoted:
- chaining and control: newlines, `;`, `&` (background), `||`, `|&`, `(`, `)`, `!`, `#` comments
  (a plain `|` between two commands is a pipeline stage boundary);
- substitutions and expansions: `$` (variables, `$(...)`, `$'...'`, arithmetic), backquotes,
  process substitution `<(...)`, brace expansion `{a,b}`, an unquoted `~` anywhere (bash expands
  it at a word's start and after `=` or `:` in assignment-like words);
- here-documents and here-strings (`<<`, `<<<`), `<>`;
- control characters of any kind.
Inside double quotes `$` and backquotes are refused too; single quotes are literal.

Glob characters (`*`, `?`, `[`) are kept, and the word is marked `glob`; `Word.pattern` holds the
pattern with its quoted characters escaped, and `expand(word, cwd)` lists what bash (5.x: extglob,
dotglob, nocaseglob, globstar off; globasciiranges on) would put in its place (see hooks/globbing.py).

Standard library only, and quick to import: this runs on every tool call.
"""

from __future__ import annotations

from attune.core.errors import HookError

__all__ = ["Redirect", "Refused", "Word", "lex", "pipeline"]

_GLOB = frozenset("*?[")
_PAT_SPECIAL = frozenset("*?[]\\")
_WS = frozenset(" \t")


class Refused(HookError):
    """The command line uses a construct the policy does not run."""


class Word:
    """One word after quote removal; `glob`: has unquoted *, ? or [; `quoted`: some part was quoted;
    `pattern`: the word as a glob pattern (quoted characters escaped with a backslash)."""

    __slots__ = ("text", "glob", "quoted", "pattern")

    def __init__(self, text: str, glob: bool = False, quoted: bool = False, pattern: str | None = None) -> None:
        self.text, self.glob, self.quoted = text, glob, quoted
        self.pattern = text if pattern is None else pattern

    def __repr__(self) -> str:
        return f"Word({self.text!r}, glob={self.glob}, quoted={self.quoted})"


class Redirect:
    """`fd`: the descriptor written on the left (2 in 2>x), None when implied; `op`: > >> >| < >& <& &> &>>."""

    __slots__ = ("fd", "op", "target")

    def __init__(self, fd: int | None, op: str, target: Word) -> None:
        self.fd, self.op, self.target = fd, op, target

    @property
    def is_output(self) -> bool:
        return self.op not in ("<", "<&")

    @property
    def is_dup(self) -> bool:
        """`2>&1`, `>&-`: duplicates or closes a descriptor, names no file."""
        return self.op in (">&", "<&") and (self.target.text.isdigit() or self.target.text == "-")


def _describe(ch: str) -> str:
    names = {
        "\n": "a newline (several commands in one call)",
        "\r": "a carriage return",
        ";": "';' (command chaining)",
        "|": "'|' (a pipe or '||' chains commands)",
        "&": "'&' (background or '&&' chaining)",
        "(": "'(' (a subshell or process substitution)",
        ")": "')' (a subshell)",
        "`": "a backquote (command substitution)",
        "$": "'$' (a variable, command or arithmetic substitution)",
        "{": "'{' (brace expansion or a command group)",
        "}": "'}' (brace expansion or a command group)",
        "!": "'!' (negation or history expansion)",
        "#": "'#' (a comment hides the rest of the line)",
    }
    return names.get(ch, repr(ch))


def lex(line: str) -> tuple[list[Word], list[Redirect]]:
    """Split one simple command into words and redirections, or raise Refused."""
    stages = pipeline(line)
    if len(stages) != 1:
        raise Refused("the command is a pipeline; one simple command was expected")
    return stages[0]


def _check_characters(line: str) -> None:
    """Refuse newlines (several commands) and control characters."""
    for ch in line:
        o = ord(ch)
        if ch == "\n" or ch == "\r":
            raise Refused(f"the command contains {_describe(ch)}: run one command per call")
        if (o < 32 and ch != "\t") or o == 127:
            raise Refused(f"the command contains the control character U+{o:04X}")


def _pipe(line: str, i: int, words: list[Word]) -> None:
    """Refuse `||`, `|&` and a pipe with no command before it."""
    if line[i + 1 : i + 2] in ("|", "&"):
        raise Refused(f"the command contains '{line[i:i + 2]}' (chaining or piping stderr)")
    if not words:
        raise Refused("a pipe '|' with no command before it")


def _starts_redirect(line: str, i: int) -> bool:
    """A redirection operator that starts a token (with an optional &)."""
    ch = line[i]
    return ch in "<>" or (ch == "&" and i + 1 < len(line) and line[i + 1] == ">")


def pipeline(line: str) -> list[tuple[list[Word], list[Redirect]]]:
    """Split a pipeline into its stages (words and redirections of each), or raise Refused."""
    _check_characters(line)
    words: list[Word] = []
    redirs: list[Redirect] = []
    stages = [(words, redirs)]
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in _WS:
            i += 1
        if i >= n:
            break
        ch = line[i]
        if ch == "|":
            _pipe(line, i, words)
            words, redirs = [], []
            stages.append((words, redirs))
            i += 1
            continue
        if _starts_redirect(line, i):
            i = _redirect(line, i, None, redirs)
            continue
        if ch == "#":
            raise Refused(f"the command contains {_describe(ch)}")
        word, i, stop = _word(line, i)
        if stop is not None:  # the word ended at a redirection operator glued to it (2>x, a>x)
            fd = int(word.text) if word.text.isdigit() and not word.quoted else None
            if fd is None and word.text:
                words.append(word)
            i = _redirect(line, i, fd, redirs)
            continue
        words.append(word)
    if not words and len(stages) > 1:
        raise Refused("a pipe '|' with no command after it")
    return stages


def _word(line: str, i: int) -> tuple[Word, int, str | None]:
    """Read one word from `i`; returns it, the next index, and '<'/'>' if a redirection follows."""
    n = len(line)
    buf: list[str] = []
    pat: list[str] = []  # the same characters, quoted ones escaped for the glob matcher
    glob = quoted = False

    def lit(text: str) -> None:
        buf.append(text)
        pat.append("".join("\\" + c if c in _PAT_SPECIAL else c for c in text))

    while i < n:
        ch = line[i]
        if ch in _WS or ch == "|":
            break
        if ch == "'":
            end = line.find("'", i + 1)
            if end < 0:
                raise Refused("the command has an unterminated single quote")
            lit(line[i + 1 : end])
            quoted = True
            i = end + 1
            continue
        if ch == '"':
            part: list[str] = []
            i = _double(line, i + 1, part)
            lit("".join(part))
            quoted = True
            continue
        if ch == "\\":
            if i + 1 >= n:
                raise Refused("the command ends with a backslash (line continuation)")
            lit(line[i + 1])
            quoted = True
            i += 2
            continue
        if ch in "<>":
            return Word("".join(buf), glob, quoted, "".join(pat)), i, ch
        if ch == "&" and i + 1 < n and line[i + 1] == ">":
            return Word("".join(buf), glob, quoted, "".join(pat)), i, ch
        if ch in ";&()`${}!":
            raise Refused(f"the command contains {_describe(ch)}")
        if ch == "#" and not buf:
            raise Refused(f"the command contains {_describe(ch)}")
        if ch == "~":
            raise Refused("the command has an unquoted '~' (home directory expansion); write the path out")
        if ch in _GLOB:
            glob = True
        buf.append(ch)
        pat.append(ch)
        i += 1
    return Word("".join(buf), glob, quoted, "".join(pat)), i, None


def _double(line: str, i: int, buf: list[str]) -> int:
    n = len(line)
    while i < n:
        ch = line[i]
        if ch == '"':
            return i + 1
        if ch in "$`":
            raise Refused(f"the command contains {_describe(ch)} inside double quotes")
        if ch == "\\" and i + 1 < n and line[i + 1] in '"\\$`':
            buf.append(line[i + 1])
            i += 2
            continue
        buf.append(ch)
        i += 1
    raise Refused("the command has an unterminated double quote")


def _redirect(line: str, i: int, fd: int | None, redirs: list[Redirect]) -> int:
    n = len(line)
    rest = line[i:]
    for op in ("&>>", "&>", ">>", ">|", ">&", "<&", ">", "<"):
        if rest.startswith(op):
            break
    else:  # pragma: no cover - callers only come here on < > or &>
        raise Refused("unreadable redirection")
    if rest.startswith("<<"):
        raise Refused("the command uses a here-document or here-string (<<)")
    if rest.startswith("<>"):
        raise Refused("the command opens a file for reading and writing (<>)")
    if rest.startswith("<(") or rest.startswith(">("):
        raise Refused("the command uses process substitution")
    i += len(op)
    while i < n and line[i] in _WS:
        i += 1
    if i >= n:
        raise Refused(f"the redirection {op} has no target")
    if line[i] in "<>&|;()":
        raise Refused(f"the redirection {op} is followed by {line[i]!r}")
    if line[i] == "~":
        raise Refused("a redirection target starts with '~' (home directory expansion)")
    target, i, stop = _word(line, i)
    if stop is not None:
        raise Refused("two redirections are glued together")
    if not target.text:
        raise Refused(f"the redirection {op} has an empty target")
    if target.glob:
        raise Refused(f"the redirection target {target.text!r} is a pattern")
    redirs.append(Redirect(fd, op, target))
    return i
