"""The policy's glob expansion against bash itself, and the hooks' JSON against the json module.

hooks/globbing.py must give, for every pattern, at least the names bash gives (the policy checks every
one); here it must give exactly bash's words, on a tree with hidden files, symlinks, odd names and
bracket classes. hooks/hookjson.py must read and write what json does.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hooks import globbing, hookjson, shell

# ("[!x]" is left out: the shell policy refuses an unquoted "!" anywhere; "[^x]" is the same class.)
PATTERNS = [
    "*", "notes/*", "notes/l?nk", "notes/lin[[:alpha:]]", "notes/[l]ink", "notes/[^x]ink",
    "notes/[a-z]*", "notes/[[:digit:]]*", "notes/[[:upper:]]*", "notes/*[[:punct:]]*", "runs/*/log",
    "runs/r[0-9]/*", "runs/*/", "*/*", "runs/r?", "notes/\\*", "notes/'*'x", "notes/\"l\"*", "notes/[]]*",
    "notes/a[", "notes/*.md", "nomatch*", "runs/*/nomatch", "notes/[[:space:]]*", "notes/[z-a]*",
    "notes/**", "runs/*/e*", "notes/l*k", "notes/[[:alnum:]_]*", "notes/[-a]*", "notes/[a-]*",
    "/*/hostname", "notes/[[:lower:][:digit:]]*",
]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("globs")
    for d in ("notes", "runs/r1", "runs/r2", "runs/rx", ".hidden"):
        (t / d).mkdir(parents=True)
    for name in ("plan.md", "Upper.txt", "7days", "a b", "-dash", "*", "*x", "]odd", "a[", "_u", ".dot", "x-y",
                 "é-accent"):
        (t / "notes" / name).write_text("x")
    os.symlink("/etc/hostname", t / "notes" / "link")
    for r in ("r1", "r2"):
        (t / "runs" / r / "log").write_text("x")
    os.symlink("/etc", t / "runs" / "r1" / "evil_dir")
    return t


def _bash(pattern: str, cwd: Path) -> list[str]:
    p = subprocess.run(["bash", "-c", f"printf '%s\\0' {pattern}"], cwd=cwd, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    assert p.returncode == 0, p.stderr
    return [w for w in p.stdout.split("\0") if w]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_expansion_matches_bash(tree: Path, pattern: str) -> None:
    words, _ = shell.lex("ls " + pattern)
    got: list[str] = []
    for w in words[1:]:
        got += globbing.expand(w.pattern, str(tree)) if w.glob else [w.text]
    assert sorted(got) == sorted(_bash(pattern, tree)), pattern


@pytest.mark.parametrize("pattern", ["notes/.*", ".h*/x", "notes/[[=a=]]*", "notes/[[.a.]]*"])
def test_constructs_that_differ_are_refused(tree: Path, pattern: str) -> None:
    words, _ = shell.lex("ls " + pattern)
    with pytest.raises(globbing.Unsupported):
        globbing.expand(words[1].pattern, str(tree))


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, -3e-7, "x\u00e9\u2028\U0001F600", None, True, False], "b": {"c": ""}},
    [], {}, "plain", 12345678901234567890, {"esc": "q\"b\\\n\t\x01"},
])
def test_hookjson_round_trips_like_json(value: object) -> None:
    for ensure_ascii in (True, False):
        text = hookjson.dumps(value, ensure_ascii=ensure_ascii)
        assert text == json.dumps(value, ensure_ascii=ensure_ascii)
        assert hookjson.loads(text) == value == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", '{"a": 1} x', "[1,]", "{'a': 1}", "nul", '"\\x"'])
def test_hookjson_rejects_what_json_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        hookjson.loads(text)


def test_lightos_realpath_and_paths_agree_with_os(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hooks import lightos

    t = tmp_path
    (t / "a" / "b").mkdir(parents=True)
    (t / "a" / "b" / "f").write_text("x")
    os.symlink("b", t / "a" / "rel")            # relative link
    os.symlink(str(t / "a" / "b"), t / "abs")   # absolute link
    os.symlink("../a/rel/../b/f", t / "a" / "up")  # .. after a link
    os.symlink("loop2", t / "loop1")
    os.symlink("loop1", t / "loop2")
    os.symlink("chain2", t / "chain1")
    os.symlink("a/rel", t / "chain2")
    os.symlink("missing/x", t / "dangling")
    monkeypatch.chdir(t / "a")
    cases = ["a/b/f", "a/rel/f", "abs/f", "a/up", "a/rel/../b/./f", "loop1", "loop1/x/y", "chain1/f", "dangling",
             "dangling/z", "nope/../a", "a//b///f/", "abs/../a", "/", "/..", "/../etc", ".", "rel", "rel/..", "../abs"]
    for c in cases:
        p = c if c.startswith(("/", ".", "rel")) else str(t / c)
        assert lightos.path.realpath(p) == os.path.realpath(p), c
    # Below an already-real base (the policy's protected paths): the same answer as from the root.
    for base in (str(t), str(t / "a"), "/"):
        for rel in ("a/rel/f", "rel/../b/f", "up", "loop1/x", "chain1/f", "dangling/z", "../abs", "nope", "/etc/x"):
            assert lightos.realpath_below(base, rel) == os.path.realpath(os.path.join(base, rel)), (base, rel)
    for p in ["/a/b", "a/b/", "/", "a", "", "//x", "/a//"]:
        assert lightos.path.dirname(p) == os.path.dirname(p) and lightos.path.basename(p) == os.path.basename(p), p
    for parts in [("a", "b"), ("a/", "b"), ("a", "/b", "c"), ("", "x"), ("/", "x")]:
        assert lightos.path.join(*parts) == os.path.join(*parts), parts
    monkeypatch.setenv("HOME", "/home/u")
    for p in ["~", "~/x", "~user/x", "x~"]:
        assert lightos.path.expanduser(p) == os.path.expanduser(p) or p.startswith("~user"), p
