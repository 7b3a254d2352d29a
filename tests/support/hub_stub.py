"""A Hugging Face Hub stand-in served over real HTTP on 127.0.0.1.

Tests drive the real `huggingface_hub` client against it through `HF_ENDPOINT`
(or `HfApi(endpoint=...)`), so what is exercised is the client's own URL building,
header handling and error mapping, not a mock of it. The stand-in therefore answers
the way the Hub does: a status code plus the `X-Error-Code` / `X-Error-Message`
headers and a JSON `{"error": ...}` body, which is what `hf_raise_for_status`
turns into `RepositoryNotFoundError`, `GatedRepoError`, `RevisionNotFoundError`...

Hub semantics reproduced (as documented by huggingface_hub's own comments on
`hf_raise_for_status`):

- an unknown token is refused everywhere with 401 "Invalid credentials in
  Authorization header" and no error code;
- a missing repository, or a private one the caller cannot read, is 401
  `RepoNotFound` without a token and 404 `RepoNotFound` with one;
- a gated repository serves its metadata and file listing publicly; `auth-check`
  and file downloads answer 401 `GatedRepo` without a token and 403 `GatedRepo`
  for a token whose account has not been granted access;
- an unknown branch, tag or commit is 404 `RevisionNotFound`.

Besides metadata (`/api/models/{repo}[/revision/{rev}]`, with `expand`) it serves
what `snapshot_download` needs: the recursive tree listing and
`/{repo}/resolve/{rev}/{file}` (HEAD and GET, with `X-Repo-Commit`, `ETag`,
`Content-Length` and Range support).

`slow_downloads(rate)` serves file downloads at about that many bytes per second.

Faults are scripted per path prefix: a status code (429, 500, 503...) or a hang
that lasts until the client gives up or the stub is closed. Every request is
recorded so tests can count the calls made.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterable, Mapping
from urllib.parse import parse_qs, unquote, urlsplit

INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx")
_API_SUBPATHS = {"revision", "tree", "auth-check", "refs", "commits"}
_TIMESTAMP = "2024-05-01T12:00:00.000Z"


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def git_blob_id(data: bytes) -> str:
    """The git object id of a file, which the Hub uses as the ETag of a non-LFS file."""
    return _sha1(b"blob %d\0" % len(data) + data)


@dataclass
class RepoFileEntry:
    path: str
    content: bytes
    lfs: bool

    @property
    def etag(self) -> str:
        return hashlib.sha256(self.content).hexdigest() if self.lfs else git_blob_id(self.content)

    def tree_entry(self) -> dict:
        entry: dict = {"type": "file", "oid": git_blob_id(self.content), "size": len(self.content), "path": self.path}
        if self.lfs:
            entry["lfs"] = {
                "oid": hashlib.sha256(self.content).hexdigest(),
                "size": len(self.content),
                "pointerSize": 134,
            }
        return entry


@dataclass
class StubRepo:
    """One model repository known to the stand-in."""

    repo_id: str
    files: dict[str, RepoFileEntry]
    gated: str | bool = False
    private: bool = False
    authorized_tokens: frozenset[str] = frozenset()
    revisions: dict[str, str] = field(default_factory=dict)  # branch/tag name -> commit sha
    safetensors: dict | None = None
    disabled: bool = False

    @property
    def sha(self) -> str:
        """Commit sha of the default branch."""
        return self.revisions["main"]

    def resolve(self, revision: str) -> str | None:
        if revision in self.revisions:
            return self.revisions[revision]
        if _COMMIT_RE.match(revision) and revision in self.revisions.values():
            return revision
        return None

    def info(self, commit: str) -> dict:
        data: dict = {
            "_id": _sha1(self.repo_id.encode())[:24],
            "id": self.repo_id,
            "modelId": self.repo_id,
            "author": self.repo_id.split("/")[0] if "/" in self.repo_id else None,
            "sha": commit,
            "lastModified": _TIMESTAMP,
            "createdAt": _TIMESTAMP,
            "private": self.private,
            "disabled": self.disabled,
            "gated": self.gated,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "library_name": "transformers",
            "siblings": [{"rfilename": name} for name in sorted(self.files)],
            "usedStorage": sum(len(f.content) for f in self.files.values()),
        }
        if self.safetensors is not None:
            data["safetensors"] = self.safetensors
        return data


@dataclass
class Fault:
    """A scripted failure for requests whose path starts with `path_prefix`."""

    path_prefix: str
    status: int | None  # None with hang=True
    hang: bool
    remaining: int | None  # None: forever


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # percent-decoded path, without the query string
    query: Mapping[str, list[str]]
    token: str | None  # bearer token sent, if any
    status: int | None  # status answered; None when the request was left hanging


class HubStub:
    """A Hub stand-in on 127.0.0.1:<free port>; use as a context manager.

    >>> with HubStub() as hub:
    ...     hub.add_repo("org/tiny", files={"config.json": b"{}"})
    ...     HfApi(endpoint=hub.endpoint).model_info("org/tiny")
    """

    def __init__(self, tokens: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._repos: dict[str, StubRepo] = {}
        self._faults: list[Fault] = []
        self._tokens: set[str] = set(tokens)
        self._closing = threading.Event()
        self.requests: list[RecordedRequest] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.download_rate: float | None = None  # bytes per second of a file download; None: full speed

    # -- lifecycle -------------------------------------------------------
    def start(self) -> "HubStub":
        handler = type("_BoundHandler", (_Handler,), {"stub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="hub-stub", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "HubStub":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "HubStub is not started"
        return self._server.server_address[1]

    @property
    def endpoint(self) -> str:
        """Value for HF_ENDPOINT / HfApi(endpoint=...)."""
        return f"http://127.0.0.1:{self.port}"

    # -- configuration ---------------------------------------------------
    def add_token(self, token: str) -> None:
        """Make `token` a valid token (of an account with no special access)."""
        with self._lock:
            self._tokens.add(token)

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes | str] | None = None,
        *,
        gated: str | bool = False,
        private: bool = False,
        authorized_tokens: Iterable[str] = (),
        branches: Iterable[str] = ("main",),
        safetensors: dict | None = None,
        disabled: bool = False,
    ) -> StubRepo:
        """Register a model repository.

        `gated` is False, "auto" or "manual" as in the Hub's metadata. `authorized_tokens`
        are the tokens that may read a private repo or download from a gated one (they
        become valid tokens). Each branch gets its own deterministic commit sha; the same
        files are served at every revision. Weight-like files are marked as LFS.
        """
        if gated not in (False, "auto", "manual"):
            raise ValueError("gated must be False, 'auto' or 'manual'")
        entries = {}
        for name, content in (files or {}).items():
            data = content.encode() if isinstance(content, str) else content
            entries[name] = RepoFileEntry(path=name, content=data, lfs=name.endswith(_LFS_SUFFIXES))
        names = list(branches)
        if "main" not in names:
            names.insert(0, "main")
        repo = StubRepo(
            repo_id=repo_id,
            files=entries,
            gated=gated,
            private=private,
            authorized_tokens=frozenset(authorized_tokens),
            revisions={name: _sha1(f"{repo_id}@{name}".encode()) for name in names},
            safetensors=safetensors,
            disabled=disabled,
        )
        with self._lock:
            self._repos[repo_id] = repo
            self._tokens.update(repo.authorized_tokens)
        return repo

    def fail(self, status: int, *, times: int | None = 1, path_prefix: str = "/") -> None:
        """Answer the next `times` matching requests (None: all of them) with `status`."""
        with self._lock:
            self._faults.append(Fault(path_prefix=path_prefix, status=status, hang=False, remaining=times))

    def slow_downloads(self, bytes_per_second: float) -> None:
        """Serve file downloads (`/resolve/`) at about this rate, as a slow link to the Hub would."""
        self.download_rate = bytes_per_second

    def hang(self, *, times: int | None = 1, path_prefix: str = "/") -> None:
        """Accept the next matching requests and never answer (until the stub closes)."""
        with self._lock:
            self._faults.append(Fault(path_prefix=path_prefix, status=None, hang=True, remaining=times))

    # -- inspection ------------------------------------------------------
    def calls(self, path_prefix: str = "/", method: str | None = None) -> list[RecordedRequest]:
        with self._lock:
            return [
                r
                for r in self.requests
                if r.path.startswith(path_prefix) and (method is None or r.method == method)
            ]

    def repo(self, repo_id: str) -> StubRepo:
        """The registered repository (its `sha`, `revisions`, `files`)."""
        repo = self._repo(repo_id)
        if repo is None:
            raise KeyError(repo_id)
        return repo

    def reset_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    # -- used by the handler ----------------------------------------------
    def _take_fault(self, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if path.startswith(fault.path_prefix) and (fault.remaining is None or fault.remaining > 0):
                    if fault.remaining is not None:
                        fault.remaining -= 1
                    return fault
        return None

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _repo(self, repo_id: str) -> StubRepo | None:
        with self._lock:
            return self._repos.get(repo_id)

    def _token_valid(self, token: str) -> bool:
        with self._lock:
            return token in self._tokens


class _Answer(Exception):
    """Raised inside the handler to end a request with an error response."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


class _Handler(BaseHTTPRequestHandler):
    stub: HubStub
    _request: tuple[str, str, Mapping[str, list[str]], str | None]
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall
    server_version = "HubStub/1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet test output
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._serve("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._serve("HEAD")

    # -- dispatch --------------------------------------------------------
    def _serve(self, method: str) -> None:
        split = urlsplit(self.path)
        raw_segments = [s for s in split.path.split("/") if s]
        segments = [unquote(s) for s in raw_segments]
        path = "/" + "/".join(segments)
        query = parse_qs(split.query)
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        # Recorded before the answer is written, so a client never sees an answer the
        # record does not hold yet.
        self._request = (method, path, query, token)
        try:
            fault = self.stub._take_fault(path)
            if fault is not None and fault.hang:
                self.stub._record(RecordedRequest(method, path, query, token, None))
                self.stub._closing.wait(60)
                self.close_connection = True
                return
            if fault is not None:
                raise _Answer(fault.status or 500, _REASONS.get(fault.status or 500, "Error"))
            if token is not None and not self.stub._token_valid(token):
                raise _Answer(401, INVALID_CREDENTIALS)
            if segments[:2] == ["api", "models"] and len(segments) > 2:
                self._api_models(method, segments[2:], query, token)
            elif "resolve" in segments[1:]:
                self._resolve(method, segments, token, self.headers.get("Range"))
            else:
                raise _Answer(404, "Sorry, we can't find the page you are looking for.")
        except _Answer as answer:
            self._send_error(method, answer)

    # -- /api/models/... ---------------------------------------------------
    def _api_models(self, method: str, rest: list[str], query: Mapping[str, list[str]], token: str | None) -> None:
        if len(rest) >= 2 and rest[1] not in _API_SUBPATHS:
            repo_id, tail = f"{rest[0]}/{rest[1]}", rest[2:]
        else:
            repo_id, tail = rest[0], rest[1:]
        repo = self._visible_repo(repo_id, token)
        if not tail:
            self._send_info(method, repo, repo.sha, query)
        elif tail[0] == "revision" and len(tail) >= 2:
            self._send_info(method, repo, self._commit(repo, "/".join(tail[1:])), query)
        elif tail == ["auth-check"]:
            self._check_download_access(repo, token)
            self._send_json(method, 200, {})
        elif tail[0] == "tree" and len(tail) >= 2:
            self._commit(repo, tail[1])
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            self._send_json(method, 200, _tree(repo, "/".join(tail[2:]), recursive))
        else:
            raise _Answer(404, "Sorry, we can't find the page you are looking for.")

    def _visible_repo(self, repo_id: str, token: str | None) -> StubRepo:
        repo = self.stub._repo(repo_id)
        if repo is None or (repo.private and token not in repo.authorized_tokens):
            # The Hub does not tell "missing" from "private and not yours".
            raise _Answer(401 if token is None else 404, "Repository not found", "RepoNotFound")
        if repo.disabled:
            raise _Answer(403, "Access to this resource is disabled.")
        return repo

    def _check_download_access(self, repo: StubRepo, token: str | None) -> None:
        if not repo.gated or token in repo.authorized_tokens:
            return
        if token is None:
            raise _Answer(
                401,
                f"Access to model {repo.repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
                "GatedRepo",
            )
        raise _Answer(
            403,
            f"Access to model {repo.repo_id} is restricted and you are not in the authorized list. "
            f"Visit https://huggingface.co/{repo.repo_id} to ask for access.",
            "GatedRepo",
        )

    @staticmethod
    def _commit(repo: StubRepo, revision: str) -> str:
        commit = repo.resolve(revision)
        if commit is None:
            raise _Answer(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    def _send_info(self, method: str, repo: StubRepo, commit: str, query: Mapping[str, list[str]]) -> None:
        data = repo.info(commit)
        expand = query.get("expand") or query.get("expand[]")
        if expand:
            data = {k: v for k, v in data.items() if k in {"_id", "id"} or k in expand}
        self._send_json(method, 200, data)

    # -- /{repo}/resolve/{rev}/{file} ----------------------------------------
    def _resolve(self, method: str, segments: list[str], token: str | None, range_header: str | None) -> None:
        at = segments.index("resolve", 1)
        repo_id = "/".join(segments[:at])
        if len(segments) < at + 3:
            raise _Answer(404, "Sorry, we can't find the page you are looking for.")
        repo = self._visible_repo(repo_id, token)
        self._check_download_access(repo, token)
        commit = self._commit(repo, segments[at + 1])
        filename = "/".join(segments[at + 2 :])
        entry = repo.files.get(filename)
        if entry is None:
            raise _Answer(404, "Entry not found", "EntryNotFound")
        body = entry.content
        status = 200
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{entry.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header or "")
        if match and method == "GET":
            start = int(match.group(1))
            end = int(match.group(2)) if match.group(2) else len(body) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
            body = body[start : end + 1]
            status = 206
        self._send(method, status, body, headers)

    # -- writing -----------------------------------------------------------
    def _send_json(self, method: str, status: int, data: object) -> None:
        self._send(method, status, json.dumps(data).encode(), {"Content-Type": "application/json; charset=utf-8"})

    def _send_error(self, method: str, answer: _Answer) -> None:
        headers = {"Content-Type": "application/json; charset=utf-8", "X-Error-Message": answer.message}
        if answer.code is not None:
            headers["X-Error-Code"] = answer.code
        if answer.status == 429:
            headers["RateLimit"] = '"api";r=0;t=60'
            headers["RateLimit-Policy"] = '"fixed window";"api";q=1000;w=300'
            headers["Retry-After"] = "60"
        self._send(method, answer.status, json.dumps({"error": answer.message}).encode(), headers)

    def _send(self, method: str, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.stub._record(RecordedRequest(*self._request, status))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("X-Request-Id", "stub-" + _sha1(self.path.encode())[:12])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method == "HEAD":
            return
        rate = self.stub.download_rate if "/resolve/" in self.path else None
        if rate is None:
            self.wfile.write(body)
            return
        chunk = max(1024, int(rate / 10))
        for start in range(0, len(body), chunk):
            if self.stub._closing.is_set():
                return
            self.wfile.write(body[start : start + chunk])
            self.wfile.flush()
            time.sleep(chunk / rate)


def _tree(repo: StubRepo, prefix: str, recursive: bool) -> list[dict]:
    base = f"{prefix}/" if prefix else ""
    entries: list[dict] = []
    folders: set[str] = set()
    for name in sorted(repo.files):
        if not name.startswith(base):
            continue
        rest = name[len(base) :]
        parts = rest.split("/")
        for depth in range(1, len(parts)):
            folder = base + "/".join(parts[:depth])
            if (recursive or depth == 1) and folder not in folders:
                folders.add(folder)
                entries.append({"type": "directory", "oid": _sha1(folder.encode()), "size": 0, "path": folder})
        if recursive or len(parts) == 1:
            entries.append(repo.files[name].tree_entry())
    return entries


_REASONS = {
    429: "You have exceeded our rate limit. Please retry later.",
    500: "Internal Error - We're working hard to fix this as soon as possible!",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
