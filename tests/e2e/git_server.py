"""A git repository served over smart HTTP on loopback (git http-backend as CGI), for marketplace tests.

`serve_snapshot(src, dest)` commits the tracked files of `src` as they are in its working tree into
a fresh repository (so a test sees uncommitted edits too), clones it bare under `dest`, and serves
it; `url` is what `claude plugin marketplace add` takes. Claude Code clones shallowly, which git's
dumb HTTP transport cannot serve, hence the CGI backend. Standard library and the git CLI only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "e2e", "GIT_AUTHOR_EMAIL": "e2e@localhost",
           "GIT_COMMITTER_NAME": "e2e", "GIT_COMMITTER_EMAIL": "e2e@localhost"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def snapshot(src: Path, work: Path) -> Path:
    """A one-commit repository holding `src`'s tracked files with their working-tree contents."""
    files = [f for f in _git("ls-files", "-z", cwd=src).split("\0") if f]
    work.mkdir(parents=True)
    for f in files:
        s = src / f
        if not s.is_file():
            continue  # deleted in the working tree
        d = work / f
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(s, d)
    _git("init", "-q", "-b", "main", cwd=work)
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "snapshot", cwd=work)
    return work


class GitHTTPServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.server: ThreadingHTTPServer | None = None
        self.requests = 0

    def start(self) -> str:
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _cgi(self) -> None:
                srv.requests += 1
                path, _, query = self.path.partition("?")
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else b""
                env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_PROJECT_ROOT": str(srv.root),
                       "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": path, "QUERY_STRING": query,
                       "REQUEST_METHOD": self.command, "CONTENT_TYPE": self.headers.get("content-type", ""),
                       "CONTENT_LENGTH": str(len(body)), "REMOTE_ADDR": "127.0.0.1",
                       "GIT_PROTOCOL": self.headers.get("git-protocol", "")}
                if self.headers.get("content-encoding") == "gzip":
                    import gzip

                    body = gzip.decompress(body)
                    env["CONTENT_LENGTH"] = str(len(body))
                p = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=120)
                head, _, payload = p.stdout.partition(b"\r\n\r\n")
                if not _:
                    head, _, payload = p.stdout.partition(b"\n\n")
                status = 200
                headers = []
                for line in head.decode(errors="replace").splitlines():
                    k, _, v = line.partition(":")
                    if k.lower() == "status":
                        status = int(v.strip().split()[0])
                    elif k:
                        headers.append((k.strip(), v.strip()))
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _cgi
            do_POST = _cgi

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()


def serve_snapshot(src: Path, dest: Path, name: str = "attune.git") -> tuple[GitHTTPServer, str]:
    work = snapshot(src, dest / "work")
    _git("clone", "-q", "--bare", str(work), str(dest / "repos" / name))
    server = GitHTTPServer(dest / "repos")
    base = server.start()
    return server, f"{base}/{name}"
