"""The PreToolUse policy on a corpus: commands that must be denied (many obfuscated) and allowed.

The policy is built for a real campaign directory and a plugin tree laid out like attune's (skill
scripts, correctness lists), both under tmp_path; hooks/test_hooks.py drives the real hook process.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hooks import policy as policy_mod
from hooks import runtime, shell

DENY: list[str] = [
    # network tools, plain and obfuscated
    "curl http://example.com/x",
    "wget -q http://example.com/x",
    "c'u'rl http://example.com",
    '"curl" http://example.com',
    r"\curl http://example.com",
    "cu\\rl http://example.com",
    "/usr/bin/curl http://example.com",
    "nc -l 4444",
    "ssh node1 hostname",
    "git clone https://example.com/r.git",
    # package installs
    "pip install requests",
    "python3 -m pip install requests",
    "npm i left-pad",
    "apt-get install -y jq",
    "uv pip install numpy",
    # direct cluster and container commands
    "sbatch job.sh",
    '"sbatch" job.sh',
    r"s\batch job.sh",
    "sb''atch job.sh",
    "srun -N1 hostname",
    "scancel 1234",
    "squeue -u me",
    "kubectl delete pod trainer-0",
    "docker run --rm ubuntu",
    "\u0455batch job.sh",  # Cyrillic lookalike: not a listed command either
    # privilege changes and process killing
    "sudo ls",
    "su -c id",
    "chmod +x notes/run.sh",
    "kill -9 1",
    "pkill -f train",
    "killall python",
    # chaining, substitutions, expansions
    "ls; rm -rf /",
    "ls && curl http://x",
    "ls || true",
    "ls | sh",
    "ls & curl http://x",
    "ls\nrm -rf /",
    "cat $(echo /etc/passwd)",
    "cat `echo /etc/passwd`",
    "echo ${HOME}",
    'cat "$HOME/.ssh/id_rsa"',
    "$'\\x73batch' job.sh",
    "{sbatch,job.sh}",
    "cat <(ls /)",
    "(ls)",
    "! ls",
    "ls # ; curl http://x",
    "cat <<EOF",
    "IFS=, ls",
    "PATH=/tmp ls",
    "LD_PRELOAD=/tmp/x.so ls",
    # wrappers and interpreters
    "bash -c ls",
    "sh notes/evil.sh",
    "python3 -c 'import os'",
    "python3 notes/evil.py",
    "python3 /tmp/x.py",
    "env sbatch job.sh",
    "xargs rm",
    "nohup sbatch job.sh",
    "timeout 5 curl http://x",
    "eval ls",
    "exec ls",
    "source notes/x.sh",
    ". notes/x.sh",
    "awk 'BEGIN{system(\"id\")}'",
    "perl -e 'print 1'",
    "sed -i s/a/b/ campaign.yaml",
    # writes and redirections out of the notes
    "rm -rf runs",
    "mv ledger.jsonl /tmp/",
    "cp notes/x campaign.yaml",
    "tee notes/x",
    "mkdir notes/sub",
    "touch notes/x",
    "ln -s /etc notes/etc",
    "dd if=/dev/zero of=notes/x",
    "echo x > ledger.jsonl",
    "echo x >> campaign.yaml",
    "echo x > /tmp/out",
    "echo x > notes/../ledger.jsonl",
    "echo x >| notes/../policy.yaml",
    "ls >notes/../hooks.log.jsonl",
    "echo x > .claude/settings.json",
    "cat runs/r1/log > runs/r1/metrics.json",
    "echo x &> /tmp/y",
    "ls 2>/tmp/err",
    "sort -o campaign.yaml runs/r1/log",
    "uniq runs/r1/log notes/out",
    "find . -delete",
    "find . -name x -exec cat {} +",
    "rg --pre=sh x .",
    "date -s 2020-01-01",
    "date -f /etc/passwd",
    "grep -R secret runs",
    "grep -nR secret runs",
    "rg --follow secret runs",
    "find -L runs -name x",
    # reads outside the allow-list
    "cat /etc/shadow",
    "cat ../../../etc/passwd",
    "cat /e??/passwd",
    "ls ~/.ssh",
    "ls runs/*/../../..",
    "cat .*",
    "grep -r secret /home",
    "grep -f/etc/passwd x runs",
    "grep -nf/etc/passwd x",
    "cat -- /etc/passwd",
    "cat < /etc/passwd",
    "cat\t/etc/passwd",
    "head -n1 notes/link",
    "find / -name passwd",
    "jq . /etc/passwd",
    "ls -la /",
    "/bin/ls /",
    "tail -f /var/log/syslog",
    # attune subcommands that change things
    "attune init .",
    "attune tune campaign.yaml",
    # the skill's scripts, but reading outside
    "python3 {scripts}/summarize.py /etc/passwd",
    # unquoted/unterminated
    "echo 'unterminated",
    "ls \\",
    "",
]

ALLOW: list[str] = [
    "ls",
    "ls -la runs",
    "cat campaign.yaml",
    "cat ledger.jsonl",
    "head -n 20 runs/r1/log",
    "tail -n 50 runs/r1/log",
    "tail -n +5 runs/r1/log",
    "wc -l ledger.jsonl",
    "grep -n loss runs/r1/log",
    'grep -rn "elapsed time" runs',
    "grep -c step runs/r1/log",
    "grep -e '^iter' runs/r1/log",
    "rg -n 'throughput' runs",
    "find runs -name '*.json'",
    "find . -type f -newer campaign.yaml",
    "ls runs/*/",
    "cat runs/*/log",
    "stat ledger.jsonl",
    "du -sh runs",
    "diff runs/r1/log runs/r2/log",
    "sort -k2 -n runs/r1/log",
    "jq .data ledger.jsonl",
    "sha256sum campaign.yaml",
    "echo hello",
    'echo "a; b | c && d"',
    "echo 'literal $HOME and `ticks`'",
    "pwd",
    "date",
    "cat notes/plan.md",
    "cat < runs/r1/log",
    "cat runs/r1/log > notes/copy.txt",
    "grep loss runs/r1/log >> notes/losses.txt",
    "ls 2>/dev/null",
    "ls runs 2>&1",
    "cat {root}/skills/attune/SKILL.md",
    "python3 {scripts}/summarize.py runs/r1",
    "python3 -u {scripts}/summarize.py --top 5",
    "{scripts}/tool.sh --x 1",
    "bash {scripts}/tool.sh",
    "attune status .",
    "attune status . --json",
    "attune ledger show . --tail 5",
    "attune ledger verify .",
]


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "plugin"
    scripts = root / "skills" / "attune" / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "summarize.py").write_text("print('ok')\n")
    (scripts / "tool.sh").write_text("echo ok\n")
    (root / "skills" / "attune" / "SKILL.md").write_text("---\nname: attune\n---\n")
    (root / "gate" / "lists").mkdir(parents=True)
    (root / "gate" / "lists" / "megatron.yaml").write_text("model: megatron\n")
    camp = tmp_path / "campaign"
    for d in ("notes", "runs/r1", "runs/r2", ".claude"):
        (camp / d).mkdir(parents=True)
    (camp / "campaign.yaml").write_text("name: c\ngate:\n  lists: lists/custom.yaml  # pinned\n")
    (camp / "ledger.jsonl").write_text("")
    (camp / "runs" / "r1" / "log").write_text("iter 1 loss 3.0\n")
    (camp / "runs" / "r2" / "log").write_text("iter 1 loss 3.1\n")
    (camp / "notes" / "plan.md").write_text("plan\n")
    os.symlink("/etc/hostname", camp / "notes" / "link")
    return camp, root


def _policy(camp: Path, root: Path) -> policy_mod.Policy:
    return policy_mod.Policy.for_campaign(str(camp), str(camp), str(root))


def _fmt(cmd: str, root: Path) -> str:
    return cmd.replace("{scripts}", str(root / "skills" / "attune" / "scripts")).replace("{root}", str(root))


def test_corpus_sizes() -> None:
    assert len(DENY) >= 50 and len(ALLOW) >= 30
    assert len(set(DENY)) == len(DENY) and len(set(ALLOW)) == len(ALLOW)


@pytest.mark.parametrize("command", DENY)
def test_denied(setup: tuple[Path, Path], command: str) -> None:
    camp, root = setup
    d = _policy(camp, root).decide("Bash", {"command": _fmt(command, root)})
    assert d.decision == "deny", d
    assert d.reason.startswith("shell command denied:") or d.reason.startswith("an empty")


@pytest.mark.parametrize("command", ALLOW)
def test_allowed(setup: tuple[Path, Path], command: str) -> None:
    camp, root = setup
    d = _policy(camp, root).decide("Bash", {"command": _fmt(command, root)})
    assert d.decision == "allow", d


@pytest.mark.parametrize(
    "command, words",
    [
        ("sb''atch job.sh", "direct cluster"),
        ("curl http://x", "network tool"),
        ("pip install x", "installs packages"),
        ("sudo ls", "privileges"),
        ("kill 1", "processes"),
        ("ls; ls", "chaining"),
        ("ls || wc", "chaining"),
        ("ls | sh", "runs other programs"),
        ("echo $(id)", "substitution"),
        ("echo x > ledger.jsonl", "protected"),
        ("echo x > /tmp/x", "writes go only to the notes"),
        ("cat /etc/passwd", "outside the campaign's allow-list"),
        ("/usr/bin/sbatch x", "direct cluster"),
        ("frobnicate", "policy.yaml `commands`"),
    ],
)
def test_reasons_say_why(setup: tuple[Path, Path], command: str, words: str) -> None:
    camp, root = setup
    d = _policy(camp, root).decide("Bash", {"command": command})
    assert d.decision == "deny" and words in d.reason, d.reason


TOOLS_DENY = [
    ("Edit", {"file_path": "{camp}/campaign.yaml"}),
    ("Write", {"file_path": "{camp}/ledger.jsonl"}),
    ("Write", {"file_path": "{camp}/policy.yaml"}),
    ("Write", {"file_path": "{camp}/hooks.log.jsonl"}),
    ("Write", {"file_path": "{camp}/runs/r1/metrics.json"}),
    ("Write", {"file_path": "{camp}/.claude/settings.json"}),
    ("Write", {"file_path": "{camp}/.broker/token"}),
    ("Write", {"file_path": "{camp}/session.json"}),
    ("Edit", {"file_path": "{root}/gate/lists/megatron.yaml"}),
    ("Edit", {"file_path": "{root}/skills/attune/SKILL.md"}),
    ("Write", {"file_path": "{camp}/lists/custom.yaml"}),
    ("MultiEdit", {"file_path": "{camp}/notes/../campaign.yaml"}),
    ("Write", {"file_path": "/tmp/elsewhere.txt"}),
    ("Write", {"file_path": "{camp}/notes/link"}),
    ("NotebookEdit", {"notebook_path": "{camp}/x.ipynb"}),
    ("Read", {"file_path": "/etc/passwd"}),
    ("Read", {"file_path": "{camp}/notes/link"}),
    ("Glob", {"pattern": "**/*", "path": "/"}),
    ("Glob", {"pattern": "../../**"}),
    ("Glob", {"pattern": "/etc/*"}),
    ("Grep", {"pattern": "token", "path": "/home"}),
    ("WebFetch", {"url": "https://example.com", "prompt": "x"}),
    ("WebSearch", {"query": "x"}),
    ("mcp__github__create_issue", {}),
    ("mcp__plugin_other_broker__launch_run", {}),
    ("ReadMcpResourceTool", {"server": "github", "uri": "x"}),
    ("KillShell", {"shell_id": "1"}),
    ("SomeFutureTool", {}),
    ("Grep", {"pattern": "loss"}),  # at the campaign root: .broker/ is below it (issue 24)
    ("Bash", "not an object"),
    ("Read", {}),
]
TOOLS_ALLOW = [
    ("Read", {"file_path": "{camp}/ledger.jsonl"}),
    ("Read", {"file_path": "{root}/skills/attune/SKILL.md"}),
    ("Glob", {"pattern": "runs/**/log"}),
    ("Grep", {"pattern": "loss", "path": "{camp}/runs"}),
    ("Write", {"file_path": "{camp}/notes/new.md"}),
    ("Edit", {"file_path": "{camp}/notes/plan.md"}),
    ("mcp__plugin_attune_broker__launch_run", {}),
    ("mcp__plugin_attune_metrics__get_metrics", {}),
    ("mcp__plugin_attune_traces__analyze", {}),
    ("mcp__plugin_attune_gate__check", {}),
    ("TodoWrite", {"todos": []}),
    ("ToolSearch", {"query": "broker"}),
]


def _fill(obj: object, camp: Path, root: Path) -> object:
    if isinstance(obj, dict):
        return {k: str(v).replace("{camp}", str(camp)).replace("{root}", str(root)) for k, v in obj.items()}
    return obj


@pytest.mark.parametrize("tool, tool_input", TOOLS_DENY)
def test_tools_denied(setup: tuple[Path, Path], tool: str, tool_input: object) -> None:
    camp, root = setup
    d = _policy(camp, root).decide(tool, _fill(tool_input, camp, root))
    assert d.decision == "deny", d


@pytest.mark.parametrize("tool, tool_input", TOOLS_ALLOW)
def test_tools_allowed(setup: tuple[Path, Path], tool: str, tool_input: object) -> None:
    camp, root = setup
    d = _policy(camp, root).decide(tool, _fill(tool_input, camp, root))
    assert d.decision == "allow", d


def test_policy_file_extends_but_never_opens_protected(setup: tuple[Path, Path], tmp_path: Path) -> None:
    camp, root = setup
    fw = tmp_path / "megatron-src"
    fw.mkdir()
    (fw / "arguments.py").write_text("--overlap-grad-reduce\n")
    (camp / "policy.yaml").write_text(
        "# extends the allow-list\n"
        "commands: [nvidia-smi, 'git']\n"
        f"read_paths:\n  - {fw}   # the framework source\n"
        "write_paths:\n  - .        # the whole campaign (protected files stay closed)\n"
        '  - "scratch"\n'
        "tools: [mcp__github__search]\n"
    )
    pol = _policy(camp, root)
    assert pol.decide("Bash", {"command": "nvidia-smi"}).decision == "allow"
    assert pol.decide("Bash", {"command": f"grep -rn overlap {fw}"}).decision == "allow"
    assert pol.decide("Read", {"file_path": str(fw / "arguments.py")}).decision == "allow"
    assert pol.decide("Write", {"file_path": str(camp / "summary.md")}).decision == "allow"
    assert pol.decide("Write", {"file_path": str(camp / "scratch" / "x")}).decision == "allow"
    assert pol.decide("mcp__github__search", {}).decision == "allow"
    for protected in ("campaign.yaml", "ledger.jsonl", "policy.yaml", "hooks.log.jsonl", "runs/r1/log"):
        d = pol.decide("Write", {"file_path": str(camp / protected)})
        assert d.decision == "deny" and "protected" in d.reason, (protected, d)
    assert pol.decide("Edit", {"file_path": str(root / "gate" / "lists" / "megatron.yaml")}).decision == "deny"
    # An extended command still cannot chain or reach outside the read roots.
    assert pol.decide("Bash", {"command": "git log; curl x"}).decision == "deny"
    assert pol.decide("Bash", {"command": "git show /etc/passwd"}).decision == "deny"


@pytest.mark.parametrize(
    "text, message",
    [
        ("commands: [a\n", "line 1: a [...] or {...} that does not close"),
        ("shell: everything\n", "unknown key 'shell'"),
        ("read_paths:\n  - 'open\n", "line 2: the quoted string does not close"),
        ("  - x\n", "expected 'key: value' lines"),
        ("commands: *alias\n", "line 1: '*alias': anchors, aliases"),
        ('{"commands": 3}', "commands: expected a list of non-empty strings"),
        ("commands: [a]\ncommands: [b]\n", "line 2: key 'commands' given twice"),
        ("commands: yes\n", "quote a value that reads as a number, a boolean or null"),
        ("commands:\n  - a\n  -\n", "commands: expected a list of non-empty strings"),
    ],
)
def test_bad_policy_file_is_refused_with_its_line(text: str, message: str) -> None:
    with pytest.raises(runtime.PolicyFileError, match=message.replace("[", r"\[").replace("*", r"\*")):
        runtime.parse_policy(text)


def test_policy_file_json_and_yaml_agree() -> None:
    yaml_text = "commands: [a, 'b c']\nread_paths:\n  - /x  # c\n  - \"/y z\"\ntools: t\n"
    json_text = '{"commands": ["a", "b c"], "read_paths": ["/x", "/y z"], "tools": ["t"]}'
    assert runtime.parse_policy(yaml_text) == runtime.parse_policy(json_text)


def test_lexer_keeps_quoted_operators_literal() -> None:
    words, redirs = shell.lex("grep -e 'a|b;c' \"x y\" 2>&1 >notes/o")
    assert [w.text for w in words] == ["grep", "-e", "a|b;c", "x y"]
    assert [(r.fd, r.op, r.target.text) for r in redirs] == [(2, ">&", "1"), (None, ">", "notes/o")]
