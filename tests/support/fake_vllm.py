"""A scripted stand-in for `vllm serve`, for the failures only a GPU can produce.

This machine cannot make vLLM run out of CUDA memory or find too little free GPU
memory at start, yet the worker's recovery from exactly those failures must be tested
as a process. This script is given to the worker as its VLLM_COMMAND, e.g.::

    VLLM_COMMAND="<python> /repo/tests/support/fake_vllm.py serve"   # see command()

and receives the argv the worker gives `vllm serve`. What launch k does is read from
the JSON file named by FAKE_VLLM_SCRIPT: a list of launches (or {"launches": [...]});
launches past the end repeat the last one. Launch k is counted in FAKE_VLLM_STATE_DIR,
where every launch also appends ``{"launch", "argv", "pid", "env"}`` to launches.jsonl
(``env`` holds only the variables named in FAKE_VLLM_RECORD_ENV, comma-separated) and
every HTTP request it serves appends ``{"launch", "method", "path", "body"}`` to
requests.jsonl. A launch is one of:

- ``{"text": "NAME", "exit_code": 1}``: print constant NAME of tests.support.vllm_texts
  (wordings copied from vLLM 0.32; a callable is called with ``text_kwargs``), then exit.
- ``{"output": "literal text", "exit_code": 1}``: the same with the text given inline.
  Either may add ``"stream": "stdout"`` (default stderr, where vLLM's tracebacks go)
  and ``"delay": seconds`` before printing.
- ``{"serve": true}``: bind --host/--port and answer GET /health, GET /v1/models,
  POST /v1/chat/completions and /v1/completions (SSE when ``"stream": true``) with
  small OpenAI-shaped bodies whose completion is ``max_tokens`` words ``w0 w1 ...``.
  Options: ``"ready_after"`` seconds before binding; ``"crash_after_requests": n`` then
  print ``text``/``output`` and exit with ``exit_code`` (a crash while serving). The worker's
  warm-up request (``X-Request-Id: vllm-worker-warmup``) is answered and never counted or held.
  ``"answer_after"``: seconds each completion request is held before it is answered (a long
  generation, e.g. jobs a drain must cut).
- ``{"hang": true}``: print ``text``/``output`` if given, never become ready.

Any launch may set ``"ignore_sigterm": true``; otherwise SIGTERM ends it at once. It also
exits when orphaned (its parent died) unless FAKE_VLLM_EXIT_WITH_PARENT=0, so a killed
worker cannot leave it holding a port.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

THIS_FILE = Path(__file__).resolve()
REPO_ROOT = THIS_FILE.parents[2]


def command(python: str | None = None) -> str:
    """The VLLM_COMMAND value that runs this stand-in (shell words, as the worker parses it)."""
    return shlex.join([python or sys.executable, str(THIS_FILE), "serve"])


def write_script(path: Path, launches: Sequence[dict[str, Any]]) -> Path:
    """Write a launch script for FAKE_VLLM_SCRIPT."""
    path.write_text(json.dumps(list(launches)))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def launches(state_dir: Path) -> list[dict[str, Any]]:
    """Every launch recorded so far, in order."""
    return read_jsonl(Path(state_dir) / "launches.jsonl")


def requests(state_dir: Path) -> list[dict[str, Any]]:
    """Every HTTP request the stand-in served, in order."""
    return read_jsonl(Path(state_dir) / "requests.jsonl")


# ---------------------------------------------------------------------------- launch


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(record) + "\n")
        f.flush()


def _next_launch(state_dir: Path) -> int:
    counter = state_dir / "count"
    with open(state_dir / "count.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        k = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(k + 1))
    return k


def _text(step: dict[str, Any]) -> str | None:
    if "text" in step:
        if str(REPO_ROOT) not in sys.path:
            sys.path.insert(0, str(REPO_ROOT))
        from tests.support import vllm_texts  # lazily: only launches that print a canned text need it

        value = getattr(vllm_texts, step["text"])
        return value(**step.get("text_kwargs", {})) if callable(value) else str(value)
    if "output" in step:
        return str(step["output"])
    return None


def _emit(step: dict[str, Any]) -> None:
    text = _text(step)
    if text is None:
        return
    stream = sys.stdout if step.get("stream", "stderr") == "stdout" else sys.stderr
    stream.write(text if text.endswith("\n") else text + "\n")
    stream.flush()


def _flag(argv: Sequence[str], name: str) -> list[str]:
    """Values of a flag given as `--name v [v ...]` or `--name=v` (argparse nargs='+' style)."""
    values: list[str] = []
    for i, word in enumerate(argv):
        if word == name:
            for value in argv[i + 1 :]:
                if value.startswith("--"):
                    break
                values.append(value)
        elif word.startswith(name + "="):
            values.append(word.split("=", 1)[1])
    return values


def _model(argv: Sequence[str]) -> str | None:
    words = list(argv)
    if words and words[0] == "serve":
        words = words[1:]
    if words and not words[0].startswith("-"):
        return words[0]
    model = _flag(words, "--model")
    return model[-1] if model else None


def _watch_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    state_dir = Path(os.environ["FAKE_VLLM_STATE_DIR"])
    state_dir.mkdir(parents=True, exist_ok=True)
    script = json.loads(Path(os.environ["FAKE_VLLM_SCRIPT"]).read_text())
    steps = script["launches"] if isinstance(script, dict) else script
    k = _next_launch(state_dir)
    step: dict[str, Any] = steps[min(k, len(steps) - 1)]
    recorded = [n.strip() for n in os.environ.get("FAKE_VLLM_RECORD_ENV", "").split(",") if n.strip()]
    _append(
        state_dir / "launches.jsonl",
        {"launch": k, "argv": argv, "pid": os.getpid(), "env": {n: os.environ.get(n) for n in recorded}},
    )

    def on_term(signum: int, frame: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, signal.SIG_IGN if step.get("ignore_sigterm") else on_term)
    if os.environ.get("FAKE_VLLM_EXIT_WITH_PARENT", "1") != "0":
        _watch_parent()

    if step.get("hang"):
        _emit(step)
        while True:
            time.sleep(3600)
    if step.get("serve"):
        return _serve(argv, step, k, state_dir)
    time.sleep(float(step.get("delay", 0)))
    _emit(step)
    return int(step.get("exit_code", 1))


# ---------------------------------------------------------------------------- serving


def _words(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return int(value) if value is not None else 16


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
    else:
        text = str(body.get("prompt", ""))
    return max(1, len(text.split()))


def _serve(argv: Sequence[str], step: dict[str, Any], launch: int, state_dir: Path) -> int:
    host = (_flag(argv, "--host") or ["0.0.0.0"])[-1]
    port = int((_flag(argv, "--port") or ["8000"])[-1])
    model = _model(argv) or "unknown"
    names = _flag(argv, "--served-model-name") or [model]
    crash_after = step.get("crash_after_requests")
    served = {"count": 0}
    lock = threading.Lock()

    time.sleep(float(step.get("ready_after", 0)))
    print(f"INFO fake vllm: loading {model}", flush=True)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            pass

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self, body: Any) -> None:
            _append(
                state_dir / "requests.jsonl",
                {"launch": launch, "method": self.command, "path": self.path, "body": body, "warmup": self._warmup()},
            )

        def _warmup(self) -> bool:
            """The worker's own warm-up request (engine/warmup.py), not a job."""
            return (self.headers.get("X-Request-Id") or "").startswith("vllm-worker-warmup")

        def _maybe_crash(self) -> None:
            if crash_after is None:
                return
            with lock:
                served["count"] += 1
                if served["count"] > int(crash_after):
                    _emit(step)
                    os._exit(int(step.get("exit_code", 1)))

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            self._record(None)
            if self.path == "/health":
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path == "/v1/models":
                created = int(time.time())
                data = [
                    {"id": n, "object": "model", "created": created, "owned_by": "vllm", "root": model, "parent": None}
                    for n in names
                ]
                self._json(200, {"object": "list", "data": data})
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                body = None
            self._record(body)
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                return self._json(404, {"detail": "Not Found"})
            # The worker's own warm-up request (engine/warmup.py) is not one of the jobs a script counts or holds.
            if not self._warmup():
                self._maybe_crash()
                time.sleep(float(step.get("answer_after", 0)))
            if not isinstance(body, dict):
                return self._json(400, _error("Invalid JSON body", "BadRequestError", 400))
            requested = body.get("model")
            if requested and requested not in names:
                return self._json(404, _error(f"The model `{requested}` does not exist.", "NotFoundError", 404, "model"))
            chat = self.path == "/v1/chat/completions"
            if body.get("stream"):
                return self._sse(_stream_events(body, requested or names[0], chat))
            self._json(200, _completion(body, requested or names[0], chat))

        def _sse(self, events: list[dict[str, Any]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            payloads = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
            for payload in payloads:
                data = payload.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    print(f"INFO fake vllm: Starting vLLM server on http://{host}:{port}", flush=True)
    server.serve_forever()
    return 0


def _error(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def _usage(body: dict[str, Any], completion: int) -> dict[str, int]:
    prompt = _prompt_tokens(body)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _completion(body: dict[str, Any], model: str, chat: bool) -> dict[str, Any]:
    n = _max_tokens(body)
    text = " ".join(_words(n))
    created = int(time.time())
    if chat:
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "tool_calls": []},
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": _usage(body, n),
        }
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
        "usage": _usage(body, n),
    }


def _stream_events(body: dict[str, Any], model: str, chat: bool) -> list[dict[str, Any]]:
    n = _max_tokens(body)
    created = int(time.time())
    ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    obj = "chat.completion.chunk" if chat else "text_completion"
    pieces = [w if i == 0 else " " + w for i, w in enumerate(_words(n))]
    events: list[dict[str, Any]] = []

    def event(choice: dict[str, Any]) -> dict[str, Any]:
        return {"id": ident, "object": obj, "created": created, "model": model, "choices": [choice]}

    if chat:
        events.append(event({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}))
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        if chat:
            choice = {"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": "length" if last else None}
        else:
            choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": "length" if last else None}
        events.append(event(choice))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append({"id": ident, "object": obj, "created": created, "model": model, "choices": [], "usage": _usage(body, n)})
    return events


if __name__ == "__main__":
    sys.exit(main())
