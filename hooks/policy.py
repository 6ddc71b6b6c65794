"""The PreToolUse policy of a campaign session: deny by default, allow what is listed.

`Policy.for_campaign(campaign, cwd)` builds the allow-lists; `policy.decide(tool, input)`
returns a `Decision` (allow or deny, with the reason the agent is shown).

- Reads and searches (Read, Glob, Grep, NotebookRead, LS) only inside the read roots: the
  campaign directory, the plugin, and policy.yaml's `read_paths`; never `.broker/` (the broker's
  endpoint and token), the ledger keys or the plugin's data directory.
- Edits and writes (Edit, MultiEdit, Write, NotebookEdit, shell redirections) only inside the
  write roots: the campaign's `notes/` directory and policy.yaml's `write_paths`, and never a
  protected path (present or not): the ledger, the spec, the policy, the hook log, the broker's
  audit log, the runs and shipped directories, Claude Code's project files, the correctness lists,
  the plugin itself, the plugin's data directory, the ledger keys, and Claude Code's settings.
- Shell commands: a pipeline of simple commands, no chaining, substitutions or expansions but
  patterns, which are expanded as bash would (hooks/shell.py, hooks/globbing.py); each stage is a
  listed program with only its listed options, its file operands and file-valued options inside
  the read roots (hooks/programs.py), an allowed `attune` read-only subcommand, or one of the
  skill's own scripts without the options that would write elsewhere.
- The four attune MCP servers' tools are allowed, by exact server name; other servers' tools and
  web tools are denied.
- Tools not named here are denied (policy.yaml's `tools` may add some).
AskUserQuestion is answered by the hook itself (see pretool.py).

Standard library only.
"""

from __future__ import annotations

import posix

from attune.core.campaign_paths import (  # stdlib only, no imports of its own
    BROKER_DIR,
    NOTES_DIR,
    PROTECTED_IN_CAMPAIGN,
)
from attune.core.containment import inside
from hooks import lightos as os  # os without `import os` (see hooks/lightos.py)
from hooks import runtime

TYPE_CHECKING = False  # no typing import at run time: hooks start on every tool call
if TYPE_CHECKING:
    from typing import Any

    from hooks import shell  # imported where a shell command is decided: other tools never need it

SKILL_SCRIPTS = os.path.join("skills", "attune", "scripts")
# PROTECTED_IN_CAMPAIGN (attune/core/campaign_paths.py): the campaign files no tool may write.

# One decision per Claude Code tool (TOOLS): a tool not named here is denied until it is decided, so a new
# tool of a later client version is refused (tests/test_policy_tools.py checks the pinned client's own
# inventory, tests/data/claude_code_tools.json, against this table). The kinds:
#   shell: hooks/shell.py's policy; read: a path inside the read roots; search: a root and patterns
#   inside the read roots with no closed place below; write: a path inside the write roots;
#   resource: a resource of attune's own servers; safe: touches no file (allowed); the rest are denied
#   with the reason given.
SAFE_TOOLS = frozenset({
    "TodoWrite", "ToolSearch", "Skill", "Task", "Agent", "TaskCreate", "TaskUpdate", "TaskList", "TaskGet",
    "BashOutput", "TaskOutput", "ExitPlanMode", "EnterPlanMode", "SlashCommand", "ListMcpResourcesTool",
    # touch no files: wait, stop a background task, message or list the session's own agents
    "ScheduleWakeup", "TaskStop", "SendMessage", "ListAgents",
})
READ_TOOLS = {"Read": "file_path", "NotebookRead": "notebook_path", "LS": "path"}
SEARCH_TOOLS = {"Glob", "Grep"}
WRITE_TOOLS = {"Edit": "file_path", "MultiEdit": "file_path", "Write": "file_path", "NotebookEdit": "notebook_path"}
WEB_TOOLS = frozenset({"WebFetch", "WebSearch"})
RESOURCE_TOOLS = frozenset({"ReadMcpResourceTool", "ReadMcpResourceDirTool"})
DENIED_TOOLS = {
    "CronCreate": "schedules prompts that run outside this session's budget and hooks",
    "CronDelete": "schedules are not used in a campaign session",
    "CronList": "schedules are not used in a campaign session",
    "EnterWorktree": "creates a git worktree (files outside the notes)",
    "ExitWorktree": "worktrees are not used in a campaign session",
    "Monitor": "runs and watches commands outside the shell policy",
    "Workflow": "runs multi-step workflows outside the campaign's tools",
    "ReportFindings": "a code-review tool, not part of a campaign",
    "KillShell": "background shells are not started in a campaign session",
}
TOOLS: dict[str, str] = {
    "Bash": "shell",
    **{t: "read" for t in READ_TOOLS}, **{t: "search" for t in SEARCH_TOOLS},
    **{t: "write" for t in WRITE_TOOLS}, **{t: "web" for t in WEB_TOOLS},
    **{t: "resource" for t in RESOURCE_TOOLS}, **{t: "safe" for t in SAFE_TOOLS},
    **{t: "denied" for t in DENIED_TOOLS},
}


def tool_kind(tool: str) -> str | None:
    """The decided kind of a Claude Code tool ('mcp' for every MCP tool), or None: not decided, denied."""
    if tool.startswith("mcp__"):
        return "mcp"
    return TOOLS.get(tool)


# Read-only programs and their options: hooks/programs.py (loaded only for shell commands).
ATTUNE_READ_ONLY: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    # (subcommand words, options refused with every abbreviation argparse accepts)
    (("status",), ()), (("ledger", "show"), ()), (("ledger", "verify"), ()), (("validate",), ()),
    (("schema",), ("--write",)), (("metrics",), ()), (("--version",), ()), (("--help",), ()), (("-h",), ()),
)
# The skill's scripts: options that would write outside the notes (argparse takes any unique prefix).
SKILL_SCRIPT_DENY = {"add_lesson.py": ("--file",)}
# jq builtins that read the environment, name input files, or load modules from the search path.
JQ_DENY = frozenset({"env", "$ENV", "input_filename", "import", "include", "modulemeta", "get_search_list",
                     "get_prog_origin", "get_jq_origin", "$__prog_args", "$__loc__"})

_CATEGORIES: list[tuple[str, frozenset[str]]] = [
    ("is a network tool: a campaign session has no network access; the broker reaches the cluster", frozenset({
        "curl", "wget", "nc", "ncat", "netcat", "ssh", "scp", "sftp", "rsync", "ftp", "tftp", "telnet", "socat",
        "http", "https", "httpie", "xh", "aria2c", "lynx", "links", "w3m", "ping", "dig", "nslookup", "host",
        "traceroute", "nmap", "openssl", "git", "gh", "s3cmd", "aws", "gsutil", "gcloud", "az", "rclone",
    })),
    ("installs packages: a campaign runs with what is installed", frozenset({
        "pip", "pip3", "pipx", "uv", "uvx", "conda", "mamba", "micromamba", "npm", "npx", "pnpm", "yarn",
        "apt", "apt-get", "aptitude", "dpkg", "yum", "dnf", "rpm", "apk", "brew", "gem", "cargo", "go",
        "easy_install", "poetry", "pdm", "hatch", "spack", "snap", "flatpak", "nix", "nix-env",
    })),
    ("is a direct cluster or container command: launch, watch and cancel jobs through the broker's tools", frozenset({
        "sbatch", "srun", "scancel", "squeue", "sinfo", "sacct", "scontrol", "salloc", "sattach", "sstat",
        "sprio", "sshare", "sreport", "sacctmgr", "strigger", "kubectl", "helm", "k9s", "oc", "kustomize",
        "qsub", "qdel", "qstat", "qalter", "bsub", "bkill", "bjobs", "flux", "enroot", "docker", "podman",
        "singularity", "apptainer", "nvidia-smi", "torchrun", "mpirun", "mpiexec", "deepspeed",
    })),
    ("changes privileges or ownership", frozenset({
        "sudo", "su", "doas", "pkexec", "runuser", "chmod", "chown", "chgrp", "setfacl", "chattr", "setcap",
        "newgrp", "sg", "passwd", "useradd", "usermod", "visudo", "mount", "umount", "chroot", "unshare",
        "nsenter", "capsh", "setpriv", "hostname",
    })),
    ("ends or signals processes: cancel runs through the broker", frozenset({
        "kill", "pkill", "killall", "xkill", "skill", "slay", "fuser", "systemctl", "service", "shutdown",
        "reboot", "halt", "poweroff", "init", "telinit", "renice",
    })),
    ("runs other programs or code: only listed commands and the skill's scripts run", frozenset({
        "bash", "sh", "zsh", "dash", "ksh", "fish", "csh", "tcsh", "perl", "ruby", "node", "deno", "bun",
        "php", "lua", "tclsh", "awk", "gawk", "mawk", "eval", "exec", "source", ".", "env", "command",
        "builtin", "nohup", "xargs", "timeout", "nice", "ionice", "stdbuf", "time", "watch", "setsid",
        "parallel", "script", "expect", "screen", "tmux", "busybox", "make", "cmake", "gcc", "cc", "ld",
        "sed", "vi", "vim", "nano", "emacs", "ed", "less", "more", "man", "crontab", "at", "batch", "trap",
        "alias", "export", "set", "unset", "declare", "typeset", "readonly", "local", "let", "cd", "pushd",
        "popd", "ulimit", "umask", "jupyter", "ipython", "pytest",
    })),
    ("writes, moves or deletes files: write notes with the Write or Edit tool", frozenset({
        "rm", "rmdir", "mv", "cp", "tee", "dd", "touch", "mkdir", "ln", "truncate", "install", "shred",
        "patch", "unzip", "tar", "gzip", "gunzip", "zip", "bzip2", "xz", "7z", "split", "csplit", "mkfifo",
        "mknod", "xxd", "sponge", "unlink", "rename",
    })),
]



def _is_assignment(word: str) -> bool:
    """NAME=value (a variable assignment before the command)."""
    name, eq, _ = word.partition("=")
    return bool(eq) and bool(name) and not name[0].isdigit() and name.replace("_", "a").isascii() and \
        name.replace("_", "a").isalnum()


def _is_python(name: str) -> bool:
    """python, python3 or python3.N."""
    if name in ("python", "python3"):
        return True
    return name.startswith("python3.") and name[8:].isdigit() and name[8:].isascii()


_PY_FLAGS = "uBIEsSOqb"  # python options a skill script may run under (-W takes a value; -X is refused)
GLOB_MATCH_LIMIT = 2000
FIND_ZERO = frozenset((
    "-print", "-print0", "-ls", "-true", "-false", "-prune", "-quit", "-empty", "-readable", "-writable",
    "-executable", "-nouser", "-nogroup", "-depth", "-mount", "-xdev", "-noleaf", "-daystart", "-not", "-a",
    "-and", "-o", "-or", "!", "(", ")", ",", "-ignore_readdir_race", "-noignore_readdir_race", "-d",
))
FIND_DATA = frozenset((
    "-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename", "-regex", "-iregex", "-regextype",
    "-type", "-xtype", "-maxdepth", "-mindepth", "-size", "-mtime", "-mmin", "-atime", "-amin", "-ctime",
    "-cmin", "-user", "-group", "-uid", "-gid", "-perm", "-links", "-inum", "-printf", "-used", "-lname",
    "-ilname", "-fstype",
))
FIND_FILE = frozenset(["-newer", "-anewer", "-cnewer", "-samefile"])


class Decision:
    """allow or deny, the reason the agent is shown, and what was decided on (for the log)."""

    __slots__ = ("decision", "reason", "subject")

    def __init__(self, decision: str, reason: str, subject: str = "") -> None:
        self.decision, self.reason, self.subject = decision, reason, subject

    def __repr__(self) -> str:
        return f"Decision({self.decision!r}, {self.reason!r}, {self.subject!r})"


def allow(reason: str, subject: str = "") -> Decision:
    return Decision("allow", reason, subject)


def deny(reason: str, subject: str = "") -> Decision:
    return Decision("deny", reason, subject)


def category(name: str) -> str | None:
    base = os.path.basename(name)
    for why, names in _CATEGORIES:
        if base in names:
            return why
    if _is_python(base) or base.startswith("python"):
        return "runs other programs or code: only the skill's scripts run under python"
    return None


class Policy:
    """A campaign's allow-lists; build it with `Policy.for_campaign`."""

    def __init__(self, campaign: str, cwd: str, plugin_root: str, read_roots: list[str], write_roots: list[str],
                 protected: list[str], extra_commands: frozenset[str], extra_tools: frozenset[str],
                 unreadable: list[str] | None = None) -> None:
        self.campaign, self.cwd, self.plugin_root = campaign, cwd, plugin_root
        self.unreadable = unreadable or []
        self.read_roots, self.write_roots, self.protected = read_roots, write_roots, protected
        self.extra_commands, self.extra_tools = extra_commands, extra_tools
        self._spec_list: str | None = None

    @classmethod
    def for_campaign(cls, campaign: str, cwd: str | None = None, plugin_root: str | None = None) -> Policy:
        """Build a campaign's policy; raises runtime.PolicyFileError on a bad policy.yaml."""
        campaign = os.path.realpath(campaign)
        root = os.path.realpath(plugin_root or runtime.PLUGIN_ROOT)
        extra = runtime.load_policy(campaign)

        def resolve(p: str) -> str:
            return os.path.realpath(os.path.join(campaign, os.path.expanduser(p)))

        # Every entry resolved once: `campaign` and `root` are real, so only the parts below them are walked.
        protected = [os.realpath_below(campaign, p) for p in PROTECTED_IN_CAMPAIGN]
        protected.append(root)
        protected.append(os.realpath_below(root, "gate/lists"))
        for env in ("CLAUDE_PLUGIN_DATA", "CLAUDE_CONFIG_DIR"):
            if os.environ.get(env):
                protected.append(os.path.realpath(os.environ[env]))
        home = os.path.expanduser("~")
        if home and home != "~":
            protected.append(os.path.realpath(os.path.join(home, ".claude")))
            protected.append(os.path.realpath(os.path.join(home, ".claude.json")))
        project = os.environ.get("CLAUDE_PROJECT_DIR")
        if project:
            protected.append(os.path.realpath(os.path.join(project, ".claude")))
            protected.append(os.path.realpath(os.path.join(project, ".mcp.json")))
        keys = _ledger_keys_dirs()  # resolved
        protected.extend(keys)
        unreadable = [os.realpath_below(campaign, BROKER_DIR), *keys]
        if os.environ.get("CLAUDE_PLUGIN_DATA"):
            unreadable.append(os.path.realpath(os.environ["CLAUDE_PLUGIN_DATA"]))
        return cls(
            campaign=campaign,
            cwd=os.path.realpath(cwd or campaign),
            plugin_root=root,
            read_roots=[campaign, root, *[resolve(p) for p in extra.get("read_paths", [])]],
            write_roots=[os.path.join(campaign, NOTES_DIR), *[resolve(p) for p in extra.get("write_paths", [])]],
            protected=protected,
            extra_commands=frozenset(extra.get("commands", [])),
            extra_tools=frozenset(extra.get("tools", [])),
            unreadable=unreadable,
        )

    # ------------------------------------------------------------------ paths
    @property
    def notes(self) -> str:
        return os.path.join(self.campaign, NOTES_DIR)

    @property
    def scripts_dir(self) -> str:
        return os.path.join(self.plugin_root, SKILL_SCRIPTS)

    def real(self, path: str) -> str:
        return os.path.realpath(os.path.join(self.cwd, path))

    def readable(self, path: str) -> bool:
        real = self.real(path)
        if real in ("/dev/null",):
            return True
        if any(inside(real, u) for u in self.unreadable):
            return False
        return any(inside(real, r) for r in self.read_roots)

    @property
    def spec_list_file(self) -> str:
        """The correctness list campaign.yaml names, read only when a write is decided: reading campaign.yaml
        is the costliest step of building a policy, and most tool calls write nothing."""
        if self._spec_list is None:
            self._spec_list = os.path.realpath(_spec_list_file(self.campaign, self.plugin_root))
        return self._spec_list

    def write_problem(self, path: str) -> str | None:
        """None if the path may be written, else why not."""
        real = self.real(path)
        if real == "/dev/null":
            return None
        for p in self.protected:
            if p == self.plugin_root and inside(real, self.campaign):
                continue  # a campaign inside the plugin's tree (examples/) keeps its notes writable
            if inside(real, p):
                return self._protected_problem(path, real)
        # The spec's list last: a write the protected paths already refuse needs no campaign.yaml read.
        spec_list = self.spec_list_file
        if not (spec_list == self.plugin_root and inside(real, self.campaign)) and inside(real, spec_list):
            return self._protected_problem(path, real)
        if any(inside(real, r) for r in self.write_roots):
            return None
        return f"{path} is outside the campaign's notes ({self.notes}): writes go only to the notes"

    def _protected_problem(self, path: str, real: str) -> str:
        if inside(real, self.plugin_root):
            return f"{path} is part of the attune plugin (code, skill, correctness lists): never writable"
        return f"{path} is protected (the ledger, campaign spec, policy, logs, runs and settings are never writable)"

    def read_problem(self, path: str, what: str = "reads") -> str | None:
        if self.readable(path):
            return None
        real = self.real(path)
        if any(inside(real, u) for u in self.unreadable):
            return f"{path} is closed to {what} (the broker's endpoint and token, the ledger keys, the plugin's data)"
        return f"{path} is outside the campaign's allow-list for {what} (the campaign, the plugin, policy.yaml read_paths)"

    def _check_read(self, value: Any) -> str | None:
        text = value if isinstance(value, str) else value.text
        if text in ("", "-"):
            return None
        if text.startswith("~"):
            return f"{text} starts with '~'; write the path out"
        return self.read_problem(text)

    def _expand(self, words: list[shell.Word]) -> list[shell.Word]:
        """Replace every pattern with the words bash would give it (raises globbing.Unsupported)."""
        if not any(w.glob for w in words):
            return words
        from hooks import globbing, shell  # only patterns need it

        out: list[shell.Word] = []
        for w in words:
            if not w.glob:
                out.append(w)
                continue
            matches = globbing.expand(w.pattern, self.cwd)
            if len(matches) > GLOB_MATCH_LIMIT:
                raise globbing.Unsupported(f"the pattern {w.text!r} matches more than {GLOB_MATCH_LIMIT} paths")
            out.extend(shell.Word(m, quoted=True) for m in matches)
        return out

    def _arg_problem(self, word: shell.Word, positional: bool) -> str | None:
        """A conservative read-path check on one argument of a program without an option spec."""
        text = word.text
        if not text:
            return None
        candidates: list[str] = []
        if positional:
            candidates.append(text)
        elif text.startswith("--"):
            if "=" in text:
                candidates.append(text.split("=", 1)[1])
        else:
            # -fVALUE or combined flags (-nfVALUE): every suffix up to the first '/' may be a value.
            slash = text.find("/")
            stop = slash if slash >= 0 else len(text)
            candidates.extend(text[j:] for j in range(2, stop + 1) if text[j:])
        for c in candidates:
            problem = self._check_read(c)
            if problem:
                return problem
        return None

    # ------------------------------------------------------------------ shell
    def decide_bash(self, command: Any) -> Decision:
        if not isinstance(command, str) or not command.strip():
            return deny("an empty or missing shell command", runtime.clip(command))
        subject = runtime.clip(command)
        from hooks import shell

        try:
            stages = shell.pipeline(command)
        except shell.Refused as exc:
            return deny(f"shell command denied: {exc}", subject)
        reasons = []
        for words, redirs in stages:
            d = self._decide_stage(words, redirs, subject)
            if d.decision != "allow":
                return d
            reasons.append(d.reason)
        if len(reasons) == 1:
            return allow(reasons[0], subject)
        return allow("a pipeline of allowed commands: " + " | ".join(reasons), subject)

    def _decide_stage(self, words: list[shell.Word], redirs: list[shell.Redirect], subject: str) -> Decision:
        if not words:
            return deny("shell command denied: only redirections, no command", subject)
        head = words[0]
        if not head.quoted and _is_assignment(head.text):
            return deny("shell command denied: it sets environment variables before the command", subject)
        if head.glob:
            return deny(f"shell command denied: the command name {head.text!r} is a pattern", subject)
        for r in redirs:
            if r.is_dup:
                continue
            if r.is_output:
                problem = self.write_problem(r.target.text)
                if problem:
                    return deny(f"shell command denied: redirection {r.op} {r.target.text}: {problem}", subject)
            else:
                problem = self.read_problem(r.target.text)
                if problem:
                    return deny(f"shell command denied: input redirection: {problem}", subject)
        try:
            args = self._expand(words[1:])
        except Exception as exc:  # globbing.Unsupported, or a directory that cannot be listed
            return deny(f"shell command denied: a pattern is not expanded here ({exc}); name the files", subject)
        return self._decide_program(head, args, subject)

    def _decide_program(self, head: shell.Word, args: list[shell.Word], subject: str) -> Decision:
        name = head.text
        base = os.path.basename(name)
        if not name:
            return deny("shell command denied: an empty command name", subject)
        # The skill's own scripts, run directly or under python/bash/sh.
        if "/" in name:
            script = self.real(name)
            if self._is_skill_script(script):
                return self._skill_script(script, args, subject)
            if _is_python(base) and self._interpreter_ok(script):
                return self._python(args, subject)
            why = category(base)
            detail = f" ({base} {why})" if why else ""
            return deny(f"shell command denied: {name} runs a program by path{detail}; "
                        f"only the skill's scripts in {self.scripts_dir} run that way", subject)
        if _is_python(name):
            return self._python(args, subject)
        if name in ("bash", "sh") and args and self._is_skill_script(self.real(args[0].text)):
            return self._skill_script(self.real(args[0].text), args[1:], subject)
        if name == "attune":
            return self._attune(args, subject)
        from hooks import programs

        if name in programs.NAMES:
            return self._listed(name, args, subject)
        if name in self.extra_commands:
            return self._check_args(args, subject, f"{name} (policy.yaml commands)")
        why = category(name)
        if why:
            return deny(f"shell command denied: {name} {why}", subject)
        return deny(f"shell command denied: {name} is not on the campaign's allow-list of read-only commands "
                    "(policy.yaml `commands` may add it)", subject)

    def _listed(self, name: str, args: list[shell.Word], subject: str) -> Decision:
        from hooks import programs

        what = f"read-only command {name}"
        if name == "echo":
            return allow(what, subject)
        if name == "printf":
            if args and args[0].text.startswith("-v"):
                return deny("shell command denied: printf -v assigns a shell variable", subject)
            return allow(what, subject)
        if name == "find":
            return self._find(args, subject)
        spec = programs.get(name)
        assert spec is not None
        try:
            parts = programs.parse(spec, args)
        except programs.Denied as exc:
            return deny(f"shell command denied: {exc}", subject)
        if self.unreadable and _recursive(name, args):
            files = [v if isinstance(v, str) else v.text for k, v in parts if k == "file"] or ["."]  # type: ignore[union-attr]
            for f in files:
                real = self.real(f)
                held = [u for u in self.unreadable if inside(u, real)]
                if held:
                    return deny(f"shell command denied: {name} would search {f} recursively, and it holds "
                                f"{held[0]} (the broker's token, the ledger keys or the plugin's data): "
                                "search the directories below it (runs/, notes/)", subject)
        for kind, value in parts:
            text = value if isinstance(value, str) else value.text  # type: ignore[union-attr]
            if kind == "file":
                problem = self._check_read(text)
                if problem:
                    return deny(f"shell command denied: {problem}", subject)
            elif kind == "pattern" and name == "jq":
                problem = _jq_problem(text)
                if problem:
                    return deny(f"shell command denied: {problem}", subject)
        return allow(what, subject)

    def _find(self, args: list[shell.Word], subject: str) -> Decision:
        i, n = 0, len(args)
        while i < n and args[i].text in ("-H", "-P"):
            i += 1
        starts = []
        while i < n and not (args[i].text.startswith("-") and len(args[i].text) > 1) and args[i].text not in "(!),":
            starts.append(args[i].text)
            i += 1
        for p in starts or ["."]:
            problem = self._check_read(p)
            if problem:
                return deny(f"shell command denied: {problem}", subject)
        while i < n:
            t = args[i].text
            i += 1
            if t in FIND_ZERO:
                continue
            if t in FIND_DATA:
                i += 1
            elif t in FIND_FILE or (t.startswith("-newer") and len(t) == 8 and t[6] in "aBcm" and t[7] in "aBcmt"):
                if i >= n:
                    return deny(f"shell command denied: find {t} needs a file", subject)
                if not t.endswith("t") or t in FIND_FILE:
                    problem = self._check_read(args[i].text)
                    if problem:
                        return deny(f"shell command denied: {problem}", subject)
                i += 1
            else:
                return deny(f"shell command denied: find {t} is not an expression a campaign session may use "
                            "(-exec, -ok, -delete, -fprint, -fls, -L, -follow and -files0-from never are)", subject)
            if i > n:
                return deny(f"shell command denied: find {t} needs a value", subject)
        return allow("read-only command find", subject)

    def _is_skill_script(self, real: str) -> bool:
        return inside(real, self.scripts_dir) and real != self.scripts_dir and os.path.isfile(real)

    def _interpreter_ok(self, real: str) -> bool:
        base = os.path.basename(real)
        if not (_is_python(base) or base.startswith("python")):
            return False
        return not any(inside(real, r) for r in self.write_roots) and os.access(real, os.X_OK)

    def _python(self, args: list[shell.Word], subject: str) -> Decision:
        i = 0
        while i < len(args) and args[i].text.startswith("-") and args[i].text != "-":
            flag = args[i].text
            i += 1
            if flag == "-OO":
                continue
            for k, c in enumerate(flag[1:], 1):
                if c == "W":
                    if k == len(flag) - 1:
                        i += 1
                    break
                if c not in _PY_FLAGS:
                    return deny(f"shell command denied: python -{c} runs code that is not one of the skill's scripts "
                                f"or writes files (allowed: -{' -'.join(_PY_FLAGS)} -W)", subject)
        if i >= len(args):
            return deny("shell command denied: an interactive python; only the skill's scripts run", subject)
        script = self.real(args[i].text)
        if not self._is_skill_script(script):
            return deny(f"shell command denied: python runs only the skill's scripts ({self.scripts_dir}), "
                        f"not {args[i].text}", subject)
        return self._skill_script(script, args[i + 1 :], subject)

    def _skill_script(self, script: str, args: list[shell.Word], subject: str) -> Decision:
        name = os.path.basename(script)
        problem = _abbrev_problem(args, SKILL_SCRIPT_DENY.get(name, ()))
        if problem:
            return deny(f"shell command denied: {name} {problem} writes outside the notes", subject)
        return self._check_args(args, subject, "the skill's script " + name)

    def _attune(self, args: list[shell.Word], subject: str) -> Decision:
        texts = tuple(a.text for a in args)
        for prefix, denied in ATTUNE_READ_ONLY:
            if texts[: len(prefix)] == prefix:
                rest = args[len(prefix) :]
                problem = _abbrev_problem(rest, denied)
                if problem:
                    return deny(f"shell command denied: attune {' '.join(prefix)} {problem} writes files", subject)
                return self._check_args(rest, subject, "attune " + " ".join(prefix))
        shown = " ".join(texts[:2])
        return deny(f"shell command denied: attune {shown} is not a read-only subcommand "
                    "(allowed: status, ledger show, ledger verify, validate, schema, metrics)", subject)

    def _check_args(self, args: list[shell.Word], subject: str, what: str) -> Decision:
        positional_only = False
        for a in args:
            if a.text == "--" and not a.quoted:
                positional_only = True
                continue
            positional = positional_only or not a.text.startswith("-")
            problem = self._arg_problem(a, positional)
            if problem:
                return deny(f"shell command denied: {problem}", subject)
        return allow(what, subject)

    # ------------------------------------------------------------------ tools
    def decide(self, tool: str, tool_input: Any) -> Decision:
        if not isinstance(tool_input, dict):
            return deny(f"{tool}: the tool input is not an object")
        kind = tool_kind(tool)
        if kind == "shell":
            return self.decide_bash(tool_input.get("command"))
        if kind == "read":
            return self._decide_read(tool, tool_input)
        if kind == "search":
            return self._decide_search(tool, tool_input)
        if kind == "write":
            return self._decide_write(tool, tool_input)
        if kind == "web":
            return deny(f"{tool} denied: web tools are off in a campaign session")
        if kind == "mcp":
            return self._decide_mcp(tool)
        if kind == "resource":
            return self._decide_mcp_resource(tool, tool_input)
        if kind == "safe" or tool in self.extra_tools:
            return allow(f"{tool} reads and writes no files")
        if kind == "denied":
            return deny(f"{tool} denied: {DENIED_TOOLS[tool]}")
        return deny(f"{tool} denied: not a tool this policy has decided (policy.yaml `tools` may add it)")

    def _decide_read(self, tool: str, tool_input: dict[str, Any]) -> Decision:
        path = tool_input.get(READ_TOOLS[tool]) or (self.cwd if tool == "LS" else None)
        if not isinstance(path, str) or not path:
            return deny(f"{tool}: no path given")
        problem = self.read_problem(path)
        return deny(f"{tool} denied: {problem}", path) if problem else allow(f"{tool} inside the allow-list", path)

    def _decide_write(self, tool: str, tool_input: dict[str, Any]) -> Decision:
        path = tool_input.get(WRITE_TOOLS[tool])
        if not isinstance(path, str) or not path:
            return deny(f"{tool}: no path given")
        problem = self.write_problem(path)
        return deny(f"{tool} denied: {problem}", path) if problem else allow(f"{tool} in the notes", path)

    def _decide_mcp(self, tool: str) -> Decision:
        from attune.core import plugin_servers  # the one server list (imported only for MCP tools)

        prefix, servers = plugin_servers.TOOL_PREFIX, plugin_servers.SERVERS
        server, sep, name = tool[len(prefix):].partition("__") if tool.startswith(prefix) else ("", "", "")
        if sep and server in servers and name and name.replace("_", "").replace("-", "").isalnum():
            return allow(f"attune's {server} server", tool)
        if tool in self.extra_tools:
            return allow("listed in policy.yaml tools", tool)
        return deny(f"{tool} denied: only attune's own MCP servers ({', '.join(servers)}) "
                    "are used in a campaign session", tool)

    def _decide_mcp_resource(self, tool: str, tool_input: dict[str, Any]) -> Decision:
        server = str(tool_input.get("server", ""))
        from attune.core import plugin_servers

        if server in {f"plugin:{plugin_servers.PLUGIN}:{s}" for s in plugin_servers.SERVERS}:
            return allow("a resource of attune's servers", server)
        return deny(f"{tool} denied: server {server!r} is not one of attune's", server)

    def _decide_search(self, tool: str, tool_input: dict[str, Any]) -> Decision:
        path = tool_input.get("path") or self.cwd
        if not isinstance(path, str):
            return deny(f"{tool}: path must be a string")
        problem = self.read_problem(path, "searches")
        if problem:
            return deny(f"{tool} denied: {problem}", path)
        reach = [self.real(path)]
        for key in ("pattern", "glob") if tool == "Glob" else ("glob",):
            pat = tool_input.get(key)
            if not isinstance(pat, str) or not pat:
                continue
            problem = _pattern_problem(pat)
            if problem:
                return deny(f"{tool} denied: the pattern {pat!r} {problem}", path)
            if os.path.isabs(pat):
                top = _literal_dir(pat)
                problem = self.read_problem(top, "searches")
                if problem:
                    return deny(f"{tool} denied: {problem}", pat)
                if tool == "Glob" and key == "pattern":
                    reach[0] = top  # an absolute pattern searches from its own folder, not the path
                else:
                    reach.append(top)
            elif tool == "Glob" and key == "pattern":  # its literal leading folders narrow where it reaches
                reach[0] = os.path.realpath(os.path.join(reach[0], _literal_dir(pat)))
        for top in reach:
            closed = [u for u in self.unreadable if u != top and inside(u, top)]
            if closed:
                # The search would descend into a closed place (hidden directories are searched too): the
                # token, keys or data would be in its results. Search a folder below, or a file.
                return deny(f"{tool} denied: {top} holds {closed[0]}, closed to searches; search a folder "
                            "inside it (notes/, runs/) or one file", path)
        return allow(f"{tool} inside the allow-list", path)


def _pattern_problem(pat: str) -> str | None:
    """What is wrong with a search pattern: climbing out, or naming a hidden folder."""
    parts = pat.replace("\\", "/").split("/")
    if ".." in parts:
        return "climbs out with '..'"
    if any(p.startswith(".") and p != "." for p in parts[:-1]):
        return "names a hidden directory"
    return None


def _literal_dir(pat: str) -> str:
    """The folder a pattern's literal leading part names ('' for none; '/' at least for an absolute one)."""
    lead: list[str] = []
    for part in pat.replace("\\", "/").split("/")[:-1]:
        if any(c in part for c in "*?[{") or part.startswith("."):
            break
        lead.append(part)
    out = "/".join(lead)
    return (out or "/") if pat.startswith("/") else out


def _ledger_keys_dirs() -> list[str]:
    """Where the broker keeps the ledger's HMAC keys (never readable or writable by the agent).

    `attune.core.ledger.keys_dir()` takes `~` from the password database (a session with another $HOME
    still finds the keys); `$HOME`'s variant is denied too."""
    state = os.environ.get("XDG_STATE_HOME")
    if state:
        homes = []
        bases = [state]
    else:
        homes = [os.path.expanduser("~")]
        try:
            import pwd

            homes.append(pwd.getpwuid(posix.getuid()).pw_dir)
        except (ImportError, KeyError):
            pass
        bases = [os.path.join(h, ".local", "state") for h in homes if h and h != "~"]
    return sorted({os.path.realpath(os.path.join(b, "attune", "ledger-keys")) for b in bases})


def _recursive(name: str, args: list[shell.Word]) -> bool:
    """Does this command read files below its operands (grep -r/-d recurse, rg)? Errs towards yes."""
    if name == "rg":
        return True
    if name not in ("grep", "egrep", "fgrep"):
        return False
    for a in args:
        t = a.text
        if t == "--":
            break
        if t.startswith("--"):
            if t[2:4] in ("re", "d", "di", "de") or t.startswith(("--rec", "--dir", "--d")):
                return True
        elif t.startswith("-") and ("r" in t[1:] or "d" in t[1:]):
            return True
    return False


def _abbrev_problem(args: list[shell.Word], denied: tuple[str, ...]) -> str | None:
    """The first argument that is a denied long option or an abbreviation of one (argparse, GNU)."""
    for a in args:
        t = a.text
        if t == "--":
            return None
        if t.startswith("--") and len(t) > 2:
            name = t.split("=", 1)[0]
            for d in denied:
                if d.startswith(name):
                    return t
    return None


def _jq_problem(program: str) -> str | None:
    """jq programs may not read the environment, name their input files or load modules."""
    word = []
    for ch in program + " ":
        if ch.isalnum() or ch in "_$":
            word.append(ch)
            continue
        if word:
            w = "".join(word)
            if w in JQ_DENY or w.lstrip("$") in JQ_DENY:
                return f"jq {w} reads the environment, names input files or loads modules"
            word = []
    return None


def _spec_list_file(campaign: str, plugin_root: str) -> str:
    """The correctness list file campaign.yaml's gate uses, by the control plane's rule
    (attune.core.gatelists), read with the core's strict YAML subset. A campaign.yaml it cannot read
    (the control plane refuses such a file too) raises runtime.PolicyFileError: the hook then denies,
    rather than leave the list it might name writable."""
    from attune.core import gatelists, yamlsubset

    path = os.path.join(campaign, runtime.CAMPAIGN_FILE)
    try:
        data = yamlsubset.load_file(path)
        lists, model = gatelists.spec_fields(data)
    except OSError:
        return os.path.join(plugin_root, "gate", "lists")  # no campaign.yaml: the built-in lists only
    except ValueError as exc:
        raise runtime.PolicyFileError(f"{path}: {exc}") from None
    return gatelists.list_file(lists, model, campaign, plugin_root)
