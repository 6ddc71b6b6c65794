"""The shell policy's allow-list by option: for every program a campaign session may run, the options
it may take, which of their values are files, and what its operands are.

A spec is written like getopt: `short` lists the short options, a letter followed by `:` takes a value
(data) and by `@` takes a file (confined to the read roots); `long` lists long options, a name ending in
`=` takes a value, `=?` an optional value (only as `--name=value`), `@` a file. `deny` lists the real
options the program has that write, execute, follow links out of the allow-list or read files named
in other files: they are matched too (so that an abbreviation of one is caught) and refused with the
reason. Every other option is unknown and refused. Long options are matched as GNU getopt matches
them: an exact name, else a unique prefix (`--outp` is `--output`); an ambiguous prefix is refused.

`operands` says what the words that are not options are: `files` (paths, confined), `data` (never
paths: patterns, formats, numbers), `pattern` (the first is a pattern unless -e/-f/--regexp/--file
gave one, the rest files), `filter` (jq: the first is a jq program, the rest files), `none`.
`max_operands` bounds their number (uniq's second operand is an output file).

Standard library only; parsed lazily (only the program being checked).
"""

from __future__ import annotations

from attune.core.errors import HookError

__all__ = ["NAMES", "SPECS", "Denied", "Spec", "get", "parse"]

# name: (short, long, deny, operands[, max_operands[, digits]])
# digits: -NUM is an option (grep -5, head -20).
_RAW: dict[str, tuple] = {
    "ls": ("aAbBcCdfFgGhHiklmnNopqQrRsStuUvxXZ1I:T:w:",
           "all almost-all author escape block-size= ignore-backups color=? directory dired classify file-type "
           "format= full-time group-directories-first no-group human-readable si dereference-command-line "
           "dereference-command-line-symlink-to-dir hide= hyperlink=? indicator-style= inode ignore= kibibytes "
           "literal numeric-uid-gid hide-control-chars show-control-chars quote-name quoting-style= reverse "
           "recursive size sort= time= time-style= tabsize= width= context zero help version",
           "L dereference", "files"),
    "cat": ("AbeEnstTuv", "show-all number-nonblank show-ends number squeeze-blank show-tabs "
            "show-nonprinting help version", "", "files"),
    "head": ("qvzn:c:", "lines= bytes= quiet silent verbose zero-terminated help version", "", "files", None, True),
    "tail": ("qvzn:c:", "lines= bytes= quiet silent verbose zero-terminated help version",
             "f F s: follow=? retry pid= sleep-interval= max-unchanged-stats=", "files", None, True),
    "wc": ("cmlLw", "bytes chars lines max-line-length words total= help version", "files0-from=", "files"),
    "stat": ("LftZc:", "dereference file-system terse format= printf= cached= help version", "", "files"),
    "du": ("0abcDhHklmsSxPd:t:B:", "null all apparent-size block-size= bytes total dereference-args "
           "max-depth= human-readable inodes si summarize separate-dirs one-file-system threshold= time=? "
           "time-style= exclude= no-dereference help version",
           "L X: dereference files0-from= exclude-from=", "files"),
    "df": ("ahHiklPTt:x:B:", "all block-size= human-readable si inodes local no-sync portability print-type "
           "type= exclude-type= output=? total sync help version", "", "files"),
    "grep": ("EFGPiyvwxclLoqsbHhnTZzaUrIe:f@m:A:B:C:d:D:",
             "extended-regexp fixed-strings basic-regexp perl-regexp regexp= file@ ignore-case no-ignore-case "
             "word-regexp line-regexp null-data no-messages invert-match max-count= byte-offset line-number "
             "line-buffered with-filename no-filename label= only-matching quiet silent binary-files= text "
             "directories= devices= recursive include= exclude= exclude-dir= exclude-from@ "
             "files-without-match files-with-matches count initial-tab null before-context= after-context= "
             "context= color=? colour=? binary help version",
             "R dereference-recursive", "pattern", None, True),
    "rg": ("iSsnNlcwxvFe:f@g:t:T:A:B:C:m:oHIa0qu", "ignore-case smart-case case-sensitive line-number "
           "no-line-number files-with-matches count word-regexp line-regexp invert-match fixed-strings "
           "regexp= file@ glob= iglob= type= type-not= after-context= before-context= context= max-count= "
           "only-matching with-filename no-filename text null quiet hidden no-ignore no-heading heading "
           "max-depth= files type-list json color= sort= sortr= stats trim max-columns= help version",
           "L z follow pre= pre-glob= search-zip hostname-bin= ignore-file= replace= r: no-config",
           "pattern"),
    "find": None,  # its own parser: see policy._find
    "jq": ("nrjascSeCMRh", "null-input raw-output join-output ascii-output compact-output slurp exit-status "
           "sort-keys color-output monochrome-output raw-input tab indent= seq stream stream-errors "
           "raw-output0 unbuffered arg== argjson== args jsonargs help version",
           "f: L: from-file= library-path= slurpfile= rawfile= import", "filter"),
    "sort": ("bdfgiMhnRrVuszcCk:t:S:", "ignore-leading-blanks dictionary-order ignore-case "
             "general-numeric-sort ignore-nonprinting month-sort human-numeric-sort numeric-sort random-sort "
             "reverse version-sort sort= unique stable zero-terminated check=? key= field-separator= "
             "buffer-size= parallel= debug help version",
             "o: T: output= compress-program= files0-from= temporary-directory= random-source= batch-size= "
             "merge m", "files"),
    "uniq": ("cdDiuzf:s:w:", "count repeated all-repeated=? group=? ignore-case unique zero-terminated "
             "skip-fields= skip-chars= check-chars= help version", "", "files", 1),
    "cut": ("snzb:c:d:f:", "bytes= characters= delimiter= fields= complement only-delimited "
            "output-delimiter= zero-terminated help version", "", "files"),
    "tr": ("cCdst", "complement delete squeeze-repeats truncate-set1 help version", "", "data", 2),
    "nl": ("pb:d:f:h:i:l:n:s:v:w:", "body-numbering= section-delimiter= footer-numbering= "
           "header-numbering= line-increment= join-blank-lines= number-format= no-renumber number-separator= "
           "starting-line-number= number-width= help version", "", "files"),
    "column": ("tnexJRLlds:o:c:N:H:W:O:r:E:", "table separator= output-separator= output-width= "
               "table-columns= table-hide= table-wrap= table-order= table-name= table-right= "
               "table-noextreme= table-noheadings= table-truncate= fillrows json keep-empty-lines help version",
               "", "files"),
    "fold": ("bsw:", "bytes spaces width= help version", "", "files"),
    "expand": ("it:", "initial tabs= help version", "", "files"),
    "tac": ("brs:", "before regex separator= help version", "", "files"),
    "rev": ("", "help version", "", "files"),
    "paste": ("szd:", "serial zero-terminated delimiters= help version", "", "files"),
    "join": ("iza:e:j:o:t:v:1:2:", "ignore-case check-order nocheck-order header zero-terminated help version",
             "", "files", 2),
    "comm": ("123iz", "check-order nocheck-order output-delimiter= total zero-terminated help version",
             "", "files", 2),
    "diff": ("abBdeEilnNpqrsStTuwyZc:C:F:I:U:W:D:x:",
             "normal brief report-identical-files context=? unified=? ed rcs side-by-side width= "
             "left-column suppress-common-lines show-c-function show-function-line= label= expand-tabs "
             "initial-tab tabsize= suppress-blank-empty ignore-case ignore-tab-expansion "
             "ignore-trailing-space ignore-space-change ignore-all-space ignore-blank-lines "
             "ignore-matching-lines= text strip-trailing-cr minimal horizon-lines= speed-large-files "
             "color=? palette= new-file unidirectional-new-file help version",
             "r X: recursive no-dereference exclude-from= from-file= to-file= starting-file= "
             "line-format= old-line-format= new-line-format= unchanged-line-format= "
             "old-group-format= new-group-format= changed-group-format= unchanged-group-format= "
             "ifdef= GTYPE-group-format= LTYPE-line-format=", "files", 2),
    "cmp": ("blsi:n:", "print-bytes verbose quiet silent ignore-initial= bytes= help version", "", "files", 2),
    "md5sum": ("btz", "binary text tag zero help version",
               "c w check ignore-missing quiet status strict warn", "files"),
    "file": ("bhiLkrNp0", "brief mime mime-type mime-encoding no-dereference dereference keep-going raw "
             "no-pad print0 extension apple help version",
             "f: C m: z Z s E files-from= compile magic-file= uncompress uncompress-noreport special-files "
             "exclude= exclude-quiet= separator= preserve-date parameter= P:", "files"),
    "od": ("bcdfiloxsvA:j:N:t:S:w:", "address-radix= skip-bytes= read-bytes= format= output-duplicates "
           "strings=? width=? endian= traditional help version", "", "files"),
    "hexdump": ("bcCdoxvn:s:e:", "canonical length= skip= format= no-squeezing one-byte-octal "
                "one-byte-char one-byte-hex two-bytes-decimal two-bytes-octal two-bytes-hex help version",
                "f: format-file=", "files"),
    "strings": ("adwfn:t:e:s:", "all print-file-name bytes= radix= encoding= output-separator= "
                "include-all-whitespace data unicode=? help version", "T: target=", "files"),
    "tree": ("adfisugpDhFrtcUvCnAqNQSJXL:P:I:", "noreport du dirsfirst filesfirst prune charset= "
             "filelimit= timefmt= sort= gitignore matchdirs ignore-case inodes device help version",
             "o: R H: l T: fromfile fromtabfile info infofile=", "files"),
    "numfmt": ("zd:", "from= from-unit= to= to-unit= padding= round= suffix= unit-separator= format= "
               "invalid= field= grouping header=? delimiter= zero-terminated debug help version", "", "data"),
    "basename": ("asz:", "multiple suffix= zero help version", "", "data"),
    "dirname": ("z", "zero help version", "", "data"),
    "realpath": ("eEmLPqsz", "canonicalize-existing canonicalize-missing logical physical quiet strip "
                 "no-symlinks zero relative-to@ relative-base@ help version", "", "files"),
    "readlink": ("femnqsvz", "canonicalize canonicalize-existing canonicalize-missing no-newline quiet "
                 "silent verbose zero help version", "", "files"),
    "pwd": ("LP", "logical physical help version", "", "none"),
    "date": ("uRId:r@", "date= iso-8601=? rfc-email rfc-3339= reference@ utc universal debug "
             "resolution help version", "s: f: set= file=", "date"),
    "true": ("", "", "", "data"),
    "false": ("", "", "", "data"),
    "seq": ("wf:s:", "format= separator= equal-width help version", "", "data", 3),
    "sleep": ("", "help version", "", "data", 1),
    "nproc": ("", "all ignore= help version", "", "none"),
    # free reads /proc/meminfo only; -s/-c (repeat) are left out: a command ends
    "free": ("bkmgtphlvwL", "bytes kibi mebi gibi tebi pebi kilo mega giga tera peta human lohi line total "
             "committed wide si help version", "s: c: seconds= count=", "none"),
    "uname": ("asnrvmpio", "all kernel-name nodename kernel-release kernel-version machine processor "
              "hardware-platform operating-system help version", "", "none"),
    "whoami": ("", "help version", "", "none"),
    "id": ("agGnruzZ", "context group groups name real user zero help version", "", "data", 1),
    "which": ("as", "all help version", "", "data"),
    "echo": None,  # no options parsed: every operand is printed
    "printf": None,  # likewise, except bash's -v (assigns a variable)
}
for _alias in ("egrep", "fgrep"):
    _RAW[_alias] = _RAW["grep"]
for _alias in ("sha1sum", "sha224sum", "sha256sum", "sha384sum", "sha512sum", "b2sum"):
    _RAW[_alias] = _RAW["md5sum"]

NAMES = frozenset(_RAW)


class Spec:
    """One program's options, parsed from its _RAW entry."""

    __slots__ = ("name", "short", "long", "deny_short", "deny_long", "operands", "max_operands", "digits")

    def __init__(self, name: str, raw: tuple) -> None:
        short, long, deny, operands = raw[:4]
        self.name = name
        self.max_operands: int | None = raw[4] if len(raw) > 4 else None
        self.digits: bool = raw[5] if len(raw) > 5 else False
        self.operands: str = operands
        # short: letter -> None (flag), "data" or "file"
        self.short: dict[str, str | None] = _short(short)
        # long: name -> None (flag), "data", "file", "optional", or "two" (two values: jq --arg)
        self.long: dict[str, str | None] = {}
        self.deny_short: set[str] = set()
        self.deny_long: set[str] = set()
        for tok in long.split():
            name_, kind = _long(tok)
            self.long[name_] = kind
        for tok in deny.split():
            if len(tok.rstrip(":@")) == 1:
                self.deny_short.add(tok[0])
            else:
                self.deny_long.add(_long(tok)[0])


def _short(spec: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 0
    while i < len(spec):
        c = spec[i]
        kind = None
        if i + 1 < len(spec) and spec[i + 1] in ":@":
            kind = "data" if spec[i + 1] == ":" else "file"
            i += 1
        out[c] = kind
        i += 1
    return out


def _long(tok: str) -> tuple[str, str | None]:
    if tok.endswith("=="):
        return tok[:-2], "two"
    if tok.endswith("=?"):
        return tok[:-2], "optional"
    if tok.endswith("="):
        return tok[:-1], "data"
    if tok.endswith("@"):
        return tok[:-1], "file"
    return tok, None


SPECS: dict[str, Spec] = {}


def get(name: str) -> Spec | None:
    """The spec of a listed program (None for the ones with their own parser, KeyError if unlisted)."""
    raw = _RAW[name]
    if raw is None:
        return None
    spec = SPECS.get(name)
    if spec is None:
        spec = SPECS[name] = Spec(name, raw)
    return spec


class Denied(HookError):
    """An option the program may not take here (the message says which and why)."""


def _resolve_long(spec: Spec, name: str) -> tuple[str, bool]:
    """(the full option name, allowed?) after GNU abbreviation; raises Denied when unknown or ambiguous."""
    if name in spec.long:
        return name, True
    if name in spec.deny_long:
        return name, False
    hits = sorted({n for n in spec.long if n.startswith(name)} | {n for n in spec.deny_long if n.startswith(name)})
    if len(hits) == 1:
        return hits[0], hits[0] in spec.long
    if not hits:
        raise Denied(f"{spec.name} --{name} is not an option a campaign session may use")
    raise Denied(f"{spec.name} --{name} is ambiguous ({', '.join('--' + h for h in hits[:4])})")


_WHY = "writes files, runs programs, reads files named in other files or follows links out of the campaign"


def _long_option(spec: Spec, t: str, words: list, i: int, out: list[tuple[str, object]]) -> tuple[int, bool]:
    """Read `--name[=value]` (its value words start at i); returns (next i, gave a pattern?)."""
    n = len(words)
    name, eq, value = t[2:].partition("=")
    full, ok = _resolve_long(spec, name)
    if not ok:
        raise Denied(f"{spec.name} --{full} {_WHY}")
    kind = spec.long[full]
    gave_pattern = full in ("regexp", "file")
    if kind is None:
        if eq:
            raise Denied(f"{spec.name} --{full} takes no value")
    elif kind == "optional":
        if eq:
            out.append(("data", value))
    elif kind == "two":
        if eq or i + 1 >= n:
            raise Denied(f"{spec.name} --{full} takes two values")
        out.append(("data", words[i]))
        out.append(("data", words[i + 1]))
        i += 2
    elif eq:
        out.append((kind, value))
    elif i < n:
        out.append((kind, words[i]))
        i += 1
    else:
        raise Denied(f"{spec.name} --{full} needs a value")
    return i, gave_pattern


def _short_options(spec: Spec, t: str, words: list, i: int, out: list[tuple[str, object]]) -> tuple[int, bool]:
    """Read a cluster of short options `-abc` (a value may follow in it or be the word at i);
    returns (next i, gave a pattern?)."""
    gave_pattern = False
    j = 1
    while j < len(t):
        c = t[j]
        j += 1
        if c in spec.deny_short:
            raise Denied(f"{spec.name} -{c} {_WHY}")
        if c not in spec.short:
            raise Denied(f"{spec.name} -{c} is not an option a campaign session may use")
        kind = spec.short[c]
        if kind is None:
            continue
        gave_pattern = gave_pattern or c in "ef"
        if j < len(t):
            out.append((kind, t[j:]))
        elif i < len(words):
            out.append((kind, words[i]))
            i += 1
        else:
            raise Denied(f"{spec.name} -{c} needs a value")
        break
    return i, gave_pattern


def _operands(spec: Spec, operands: list, has_pattern: bool, out: list[tuple[str, object]]) -> None:
    """What each operand is, by the program's `operands` kind."""
    if spec.max_operands is not None and len(operands) > spec.max_operands:
        extra = "an output file" if spec.name == "uniq" else "too many"
        raise Denied(f"{spec.name} takes at most {spec.max_operands} operand(s) here ({extra})")
    for k, w in enumerate(operands):
        if spec.operands == "files":
            out.append(("file", w))
        elif spec.operands in ("pattern", "filter") and k == 0 and not has_pattern:
            out.append(("pattern", w))
        elif spec.operands in ("pattern", "filter"):
            out.append(("file", w))
        elif spec.operands == "date":
            if not getattr(w, "text", "").startswith("+"):
                raise Denied("date with an operand other than +FORMAT sets the clock")
            out.append(("data", w))
        elif spec.operands == "none":
            raise Denied(f"{spec.name} takes no operands")
        else:
            out.append(("data", w))


def parse(spec: Spec, words: list) -> list[tuple[str, object]]:
    """Split a program's arguments into ("file", word-or-text), ("data", ...), ("operand", word).

    Raises Denied for an unknown or denied option, a missing value or too many operands."""
    out: list[tuple[str, object]] = []
    operands: list[object] = []
    i, n = 0, len(words)
    only_operands = False
    gave_pattern = False  # grep/rg: -e/-f/--regexp/--file gave the pattern, so every operand is a file
    while i < n:
        w = words[i]
        t = w.text
        i += 1
        if only_operands or t == "-" or not t.startswith("-"):
            operands.append(w)
            continue
        if t == "--":
            only_operands = True
            continue
        if t.startswith("--"):
            i, gave = _long_option(spec, t, words, i, out)
        elif spec.digits and t[1:].isdigit():
            continue
        else:
            i, gave = _short_options(spec, t, words, i, out)
        gave_pattern = gave_pattern or gave
    _operands(spec, operands, gave_pattern and spec.operands == "pattern", out)
    return out
