"""A stand-in for the Runpod Serverless control plane, served on 127.0.0.1.

The worker is only ever observed through what the platform hands a client, so the
integration tier runs the worker as a process through the real runpod SDK job loop
and points that loop here. This server implements exactly the endpoints the SDK
(runpod 1.12, `runpod/serverless/modules/rp_job.py`, `rp_http.py`, `rp_ping.py`)
calls, with the URL shapes the platform gives it:

- job take (long poll): ``GET /v2/<endpoint>/job-take/<worker>?gpu=..&job_in_progress=0|1``
  answers one job as ``{"id", "input"}`` or 204; the SDK switches to
  ``/job-take-batch/<worker>?..&batch_size=N`` when it wants more than one job, which
  answers a JSON list.
- job done: ``POST /v2/<endpoint>/job-done/<worker>/<job>?gpu=..&isStream=true|false``;
  the body is the JSON the platform returns to the client (``{"output": ...}`` or
  ``{"error": "..."}``), sent as ``application/x-www-form-urlencoded`` text.
- job stream: ``POST /v2/<endpoint>/job-stream/<worker>/<job>?..``; one ``{"output": part}``
  per item a generator handler yields, in order.
- stop channel (long poll): ``GET /v2/<endpoint>/job-stop/<worker>?..`` answers
  ``{"jobsToStop": [...]}`` or 204; the SDK derives it from the job-take URL.
- heartbeat: ``GET /v2/<endpoint>/ping/<worker>?job_id=..&runpod_version=..``.

Every request must carry ``Authorization: <RUNPOD_AI_API_KEY>``; one that does not is
refused with 401 and counted, so a test can assert the worker authenticated.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

# How often a held job-take poll looks whether the worker has closed its connection.
GONE_CHECK_S = 0.05


@dataclass
class _Job:
    id: str
    input: Any
    submitted: float
    taken: list[float] = field(default_factory=list)
    stream: list[Any] = field(default_factory=list)
    done: list[Any] = field(default_factory=list)
    done_query: list[dict[str, str]] = field(default_factory=list)
    done_at: list[float] = field(default_factory=list)  # time.monotonic() of each job-done post's arrival
    stop_requested: bool = False
    streamed_at: list[float] = field(default_factory=list)
    done_at: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Request:
    """One request the worker made, as the control plane saw it."""

    method: str
    route: str
    path: str
    query: dict[str, str]
    authorized: bool
    at: float


class _Server(ThreadingHTTPServer):
    """A worker that is stopped or killed hangs up its open long-poll or post mid-reply, as the platform
    sees workers go: that is no fault of the stand-in's, so no traceback (any other error still prints one)."""

    hung_up = 0  # requests whose worker hung up before the reply was written

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError
            self.hung_up += 1
            return
        super().handle_error(request, client_address)


class ControlPlane:
    """Serves the SDK's job loop endpoints; the test side submits jobs and reads results.

    All public methods are thread-safe. Use as a context manager, or call
    `start()` / `close()`.
    """

    def __init__(
        self,
        endpoint_id: str = "ep-integration",
        worker_id: str = "worker-integration",
        api_key: str = "rp-test-api-key",
        poll_wait: float = 0.5,
    ) -> None:
        self.endpoint_id = endpoint_id
        self.worker_id = worker_id
        self.api_key = api_key
        # How long a job-take / job-stop long poll is held open when there is nothing
        # to hand out. Short, so a SIGTERMed worker's loop notices shutdown quickly.
        self.poll_wait = poll_wait
        self._cond = threading.Condition()
        self._takes_held = 0
        self._jobs: dict[str, _Job] = {}
        self._queue: list[str] = []
        self._stops: list[str] = []
        self._requests: list[Request] = []
        # Every take the worker asked for: (time.monotonic(), jobs asked for, jobs handed out).
        self._asks: list[tuple[float, int, int]] = []
        self._closing = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "ControlPlane":
        handler = _make_handler(self)
        server = _Server(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="control-plane", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def hung_up(self) -> int:
        """Requests whose worker hung up before their reply was written (no traceback is printed for them)."""
        return self._server.hung_up if self._server is not None else 0

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("ControlPlane is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def env(self, sdk_checks: bool = False) -> dict[str, str]:
        """The variables the platform gives a worker container, pointing at this server.

        The placeholders are left for the SDK to substitute, as on the platform:
        ``$ID`` in the job-take URL becomes the worker id, ``$RUNPOD_POD_ID`` and
        ``$ID`` in the done/stream URLs become the worker id and the job id.
        sdk_checks=False (the integration tier): the SDK's automatic system and GPU fitness
        checks are switched off by their documented variables. The vllm_worker never runs them
        (serving.platform replaces them), but other SDK scripts the harness runs would, and their
        internet check connects to 8.8.8.8, a public address no test on the host's network may
        reach. The platform tier (tests/platform) passes sdk_checks=True: there the worker runs
        in a network namespace with only loopback, as the SDK's production start leaves it.
        """
        base = f"{self.base_url}/v2/{self.endpoint_id}"
        query = "?gpu=integration-test"
        return {
            "RUNPOD_WEBHOOK_GET_JOB": f"{base}/job-take/$ID{query}",
            "RUNPOD_WEBHOOK_POST_OUTPUT": f"{base}/job-done/$RUNPOD_POD_ID/$ID{query}",
            "RUNPOD_WEBHOOK_POST_STREAM": f"{base}/job-stream/$RUNPOD_POD_ID/$ID{query}",
            "RUNPOD_WEBHOOK_PING": f"{base}/ping/$RUNPOD_POD_ID{query}",
            "RUNPOD_PING_INTERVAL": "1000",
            "RUNPOD_AI_API_KEY": self.api_key,
            "RUNPOD_POD_ID": self.worker_id,
            "RUNPOD_ENDPOINT_ID": self.endpoint_id,
            **({} if sdk_checks else {"RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true", "RUNPOD_SKIP_GPU_CHECK": "true"}),
        }

    # ------------------------------------------------------------------ test side

    def submit(self, input: Any, job_id: str | None = None) -> str:
        """Queue a job as a client's /run would; returns its id."""
        job_id = job_id or f"job-{uuid.uuid4().hex[:12]}"
        with self._cond:
            if job_id in self._jobs:
                raise ValueError(f"job id {job_id!r} already submitted")
            self._jobs[job_id] = _Job(id=job_id, input=input, submitted=time.monotonic())
            self._queue.append(job_id)
            self._cond.notify_all()
        return job_id

    def result(self, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """The body the worker posted to job-done: what the platform returns to the client.

        Raises TimeoutError (saying whether the job was ever taken) if none arrives.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            job = self._job(job_id)
            while not job.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    state = "taken by the worker" if job.taken else "never taken by the worker"
                    raise TimeoutError(f"no result for {job_id} within {timeout}s; the job was {state}")
                self._cond.wait(left)
            return job.done[0]

    def results_posted(self, job_id: str) -> list[dict[str, Any]]:
        """Every job-done body posted for the job (the platform keeps the first)."""
        with self._cond:
            return list(self._job(job_id).done)

    def answered_at(self, job_id: str) -> list[float]:
        """time.monotonic() of each job-done post for the job, as it arrived here."""
        with self._cond:
            return list(self._job(job_id).done_at)

    def done_query(self, job_id: str) -> dict[str, str]:
        """Query parameters of the first job-done post (e.g. ``isStream``)."""
        with self._cond:
            job = self._job(job_id)
            if not job.done_query:
                raise LookupError(f"{job_id} has no result yet")
            return dict(job.done_query[0])

    def stream_chunks(self, job_id: str) -> list[Any]:
        """The bodies posted to job-stream for the job, in order (each ``{"output": part}``)."""
        with self._cond:
            return list(self._job(job_id).stream)

    def wait_for_stream_chunks(self, job_id: str, count: int = 1, timeout: float = 60.0) -> list[Any]:
        """Block until at least `count` stream posts arrived for the job; returns them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            job = self._job(job_id)
            while len(job.stream) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{job_id} streamed {len(job.stream)} of {count} parts within {timeout}s")
                self._cond.wait(left)
            return list(job.stream)

    def stream_outputs(self, job_id: str) -> list[Any]:
        """The parts a client of /stream receives: the ``output`` of each stream post."""
        return [chunk.get("output") for chunk in self.stream_chunks(job_id)]

    def taken(self, job_id: str) -> list[float]:
        """time.monotonic() of each time the job was handed to the worker."""
        with self._cond:
            return list(self._job(job_id).taken)

    def queued(self) -> int:
        """Jobs submitted and not yet handed to a worker: the queue the platform's scaler sees."""
        with self._cond:
            return len(self._queue)

    def timeline(self, job_id: str) -> dict[str, float | None]:
        """time.monotonic() of the job's submit, first take, first stream post and first job-done post."""
        with self._cond:
            job = self._job(job_id)
            first = lambda times: times[0] if times else None  # noqa: E731
            return {
                "submitted": job.submitted,
                "taken": first(job.taken),
                "first_stream": first(job.streamed_at),
                "done": first(job.done_at),
            }

    def stop(self, job_id: str) -> None:
        """Signal the worker to stop the job, as a client's /cancel does."""
        with self._cond:
            self._job(job_id).stop_requested = True
            self._stops.append(job_id)
            self._cond.notify_all()

    def requests(self, route: str | None = None) -> list[Request]:
        """Requests received, optionally only one route: take, take-batch, done, stream, stop, ping, unknown."""
        with self._cond:
            return [r for r in self._requests if route is None or r.route == route]

    def unauthorized(self) -> list[Request]:
        with self._cond:
            return [r for r in self._requests if not r.authorized]

    def wait_for_request(self, route: str, timeout: float = 30.0) -> Request:
        """Block until the worker has made a request to the route (e.g. its first job take)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for r in self._requests:
                    if r.route == route:
                        return r
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {route!r} request within {timeout}s")
                self._cond.wait(left)

    # ------------------------------------------------------------------ server side

    def _job(self, job_id: str) -> _Job:
        try:
            return self._jobs[job_id]
        except KeyError:
            raise KeyError(f"unknown job {job_id!r}") from None

    def _record(self, request: Request) -> None:
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()

    def _hold(self, ready: Callable[[], bool], gone: Callable[[], bool]) -> None:
        """A long poll's hold (the lock held): until `ready()`, the stand-in closes, the worker closes its connection
        (`gone`, looked at every GONE_CHECK_S), or poll_wait has passed."""
        deadline = time.monotonic() + self.poll_wait
        while not ready() and not self._closing and not gone():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(min(left, GONE_CHECK_S))

    def _take(self, count: int, gone: Callable[[], bool] = lambda: False) -> list[dict[str, Any]]:
        """A held job-take poll; `gone` says the worker closed its connection, and then nothing is handed out (as
        a server that reads a closed request's context does): a job submitted while the worker gives up its poll
        stays queued rather than counted taken on a connection nobody reads (a clean-clone CI run saw that)."""
        with self._cond:
            self._takes_held += 1
            try:
                self._hold(lambda: bool(self._queue), gone)
                handed: list[dict[str, Any]] = []
                now = time.monotonic()
                while self._queue and len(handed) < count and not gone():
                    job = self._jobs[self._queue.pop(0)]
                    job.taken.append(now)
                    handed.append({"id": job.id, "input": job.input})
                self._asks.append((now, count, len(handed)))
                return handed
            finally:
                self._takes_held -= 1
                self._cond.notify_all()

    def wait_for_no_take_held(self, timeout: float = 30.0) -> None:
        """Block until no job-take poll is held open (the worker's last one answered, or given up and noticed)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._takes_held:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"a job-take poll still held after {timeout}s")
                self._cond.wait(left)

    def asks(self) -> list[tuple[float, int, int]]:
        """Every job-take the worker made: (when, jobs asked for: the batch_size, jobs handed out)."""
        with self._cond:
            return list(self._asks)

    def _take_stops(self, gone: Callable[[], bool] = lambda: False) -> list[str]:
        """A held stop poll; as `_take`, a stop is not handed to a connection the worker has closed."""
        with self._cond:
            self._hold(lambda: bool(self._stops), gone)
            if gone():
                return []
            stops, self._stops = self._stops, []
            return stops

    def _post(self, kind: str, job_id: str, body: Any, query: dict[str, str]) -> bool:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None:
                return False
            if kind == "done":
                job.done.append(body)
                job.done_query.append(query)
                job.done_at.append(time.monotonic())
            else:
                job.stream.append(body)
                job.streamed_at.append(time.monotonic())
            self._cond.notify_all()
            return True


def _route(segments: list[str]) -> str:
    # segments: ["v2", endpoint, route, ...]
    if len(segments) >= 3 and segments[0] == "v2":
        return {
            "job-take": "take",
            "job-take-batch": "take-batch",
            "job-done": "done",
            "job-stream": "stream",
            "job-stop": "stop",
            "ping": "ping",
        }.get(segments[2], "unknown")
    return "unknown"


def _make_handler(cp: ControlPlane) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            pass

        def _reply(self, status: int, body: Any = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            if body is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if data:
                self.wfile.write(data)

        def _parse(self) -> tuple[list[str], dict[str, str], str, bool]:
            parts = urlsplit(self.path)
            segments = [s for s in parts.path.split("/") if s]
            query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            authorized = self.headers.get("Authorization") == cp.api_key
            route = _route(segments)
            cp._record(
                Request(
                    method=self.command,
                    route=route,
                    path=parts.path,
                    query=query,
                    authorized=authorized,
                    at=time.monotonic(),
                )
            )
            return segments, query, route, authorized

        def _client_gone(self) -> bool:
            """The worker has closed this connection (its poll cancelled): readable, and nothing to read but EOF."""
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        def _path_ok(self, segments: list[str], length: int) -> bool:
            # The SDK must have substituted the worker id into the URL.
            return len(segments) == length and segments[1] == cp.endpoint_id and segments[3] == cp.worker_id

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            segments, query, route, authorized = self._parse()
            if not authorized:
                return self._reply(HTTPStatus.UNAUTHORIZED, {"error": "unauthorized"})
            if route in ("take", "take-batch") and self._path_ok(segments, 4):
                # Not 400: the SDK reads 400 as "no job" (FlashBoot) and would hide the fault.
                if "job_in_progress" not in query:
                    return self._reply(HTTPStatus.UNPROCESSABLE_ENTITY, {"error": "job_in_progress missing"})
                count = 1
                if route == "take-batch":
                    try:
                        count = int(query["batch_size"])
                    except (KeyError, ValueError):
                        return self._reply(HTTPStatus.UNPROCESSABLE_ENTITY, {"error": "batch_size missing"})
                jobs = cp._take(count, self._client_gone)
                if not jobs:
                    return self._reply(HTTPStatus.NO_CONTENT)
                return self._reply(HTTPStatus.OK, jobs[0] if route == "take" else jobs)
            if route == "stop" and self._path_ok(segments, 4):
                stops = cp._take_stops(self._client_gone)
                if not stops:
                    return self._reply(HTTPStatus.NO_CONTENT)
                return self._reply(HTTPStatus.OK, {"jobsToStop": stops})
            if route == "ping" and self._path_ok(segments, 4):
                return self._reply(HTTPStatus.OK, {})
            return self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route for GET {self.path}"})

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            segments, query, route, authorized = self._parse()
            if not authorized:
                return self._reply(HTTPStatus.UNAUTHORIZED, {"error": "unauthorized"})
            if route in ("done", "stream") and self._path_ok(segments, 5):
                try:
                    body = json.loads(raw.decode("utf-8"))
                except ValueError:
                    return self._reply(HTTPStatus.BAD_REQUEST, {"error": "body is not JSON"})
                if not cp._post(route, segments[4], body, query):
                    return self._reply(HTTPStatus.NOT_FOUND, {"error": f"unknown job {segments[4]}"})
                return self._reply(HTTPStatus.OK, {})
            return self._reply(HTTPStatus.NOT_FOUND, {"error": f"no route for POST {self.path}"})

    return Handler
