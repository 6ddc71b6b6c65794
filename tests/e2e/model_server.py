"""A scripted stand-in for the Anthropic Messages API, for driving the real Claude Code offline.

Claude Code honours ANTHROPIC_BASE_URL. This server answers POST /v1/messages (streamed as
server-sent events, or as one JSON message) and POST /v1/messages/count_tokens. The "model" is a
script: a list of steps, each a function that receives the request body of the main agent loop
and returns the assistant's content blocks. A step that returns tool_use blocks ends the turn with
stop_reason tool_use; a step that returns only text ends it with end_turn. Side requests (titles,
summaries: requests that offer no Bash tool) get a short text answer and do not advance the script.

Every main-loop request is kept in `requests` so a test can read what came back to the "model":
tool results, hook denials, Stop hook feedback. Standard library only.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Block = dict[str, Any]
Step = Callable[[dict[str, Any]], list[Block]]

_ids = itertools.count(1)


def text(t: str) -> Block:
    return {"type": "text", "text": t}


def tool_use(name: str, tool_input: dict[str, Any]) -> Block:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):06d}", "name": name, "input": tool_input}


def last_user_blocks(body: dict[str, Any]) -> list[Block]:
    """The content blocks of the last user message (tool results, hook feedback)."""
    for msg in reversed(body.get("messages", [])):
        if msg.get("role") == "user":
            c = msg.get("content")
            return [{"type": "text", "text": c}] if isinstance(c, str) else list(c)
    return []


def tool_results(body: dict[str, Any]) -> list[Block]:
    return [b for b in last_user_blocks(body) if b.get("type") == "tool_result"]


def result_text(block: Block) -> str:
    c = block.get("content")
    if isinstance(c, str):
        return c
    return "".join(x.get("text", "") for x in c or [] if isinstance(x, dict))


def all_text(body: dict[str, Any]) -> str:
    """Every string in the request's messages, for searching hook feedback."""
    return json.dumps(body.get("messages", []))


class ScriptedModel:
    """`steps`: a list of Step functions, or one generator function (the "agent") that yields each
    reply's blocks and reads `model.current` (the latest main-loop request) after each yield."""

    def __init__(self, steps: list[Step] | Callable[[ScriptedModel], Iterator[list[Block]]],
                 final: str = "Done.") -> None:
        self.gen: Iterator[list[Block]] | None = None
        if callable(steps):
            self.gen = steps(self)
            self.steps: list[Step] = []
        else:
            self.steps = list(steps)
        self.current: dict[str, Any] = {}
        self.final = final
        self.requests: list[dict[str, Any]] = []
        self.side_requests = 0
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.errors: list[str] = []

    # -------------------------------------------------------------- the model
    def reply(self, body: dict[str, Any]) -> list[Block]:
        tools = {t.get("name") for t in body.get("tools", []) if isinstance(t, dict)}
        with self.lock:
            if "Bash" not in tools:
                self.side_requests += 1
                if "stop-condition hook" in json.dumps(body.get("system", "")):
                    # /goal's judge: the scripted agent ends its turns only when it is done (the plugin's
                    # Stop hook is the deterministic check); answer in the judge's JSON form.
                    return [text('{"ok": true, "reason": "the scripted agent ends its turn only when done"}')]
                return [text("attune campaign")]
            self.requests.append(body)
            self.current = body
            if self.gen is not None:
                step: Step = lambda _b: next(self.gen, None) or [text(self.final)]  # noqa: E731
            elif not self.steps:
                return [text(self.final)]
            else:
                step = self.steps.pop(0)
        try:
            return step(body)
        except Exception as exc:  # a broken script must show in the test, not hang the client
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return [text(f"script error: {exc}")]

    # -------------------------------------------------------------- HTTP
    def start(self) -> str:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, obj: Any, status: int = 200) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._json({"data": [], "has_more": False})

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                path = self.path.split("?")[0]
                if path.endswith("/count_tokens"):
                    self._json({"input_tokens": 1000})
                    return
                if not path.endswith("/v1/messages"):
                    self._json({"type": "error", "error": {"type": "not_found_error", "message": path}}, 404)
                    return
                blocks = model.reply(body)
                stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
                message = {"id": f"msg_{next(_ids):06d}", "type": "message", "role": "assistant",
                           "model": body.get("model", "scripted"), "content": [], "stop_reason": None,
                           "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 0}}
                if not body.get("stream"):
                    message.update(content=blocks, stop_reason=stop, usage={"input_tokens": 100, "output_tokens": 10})
                    self._json(message)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start",
                                                                                "message": message})]
                for i, b in enumerate(blocks):
                    if b["type"] == "text":
                        events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                               "content_block": {"type": "text", "text": ""}}))
                        events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                               "delta": {"type": "text_delta", "text": b["text"]}}))
                    else:
                        events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                               "content_block": {**b, "input": {}}}))
                        events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                               "delta": {"type": "input_json_delta",
                                                                         "partial_json": json.dumps(b["input"])}}))
                    events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
                events.append(("message_delta", {"type": "message_delta",
                                                 "delta": {"stop_reason": stop, "stop_sequence": None},
                                                 "usage": {"output_tokens": 10}}))
                events.append(("message_stop", {"type": "message_stop"}))
                for name, data in events:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
