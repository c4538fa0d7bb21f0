"""A small HTTP server on 127.0.0.1 for the download tests: files, byte ranges, failures, and the two
Hugging Face Hub endpoints ``hf_hub_download`` calls (HEAD and GET of ``/{repo}/resolve/{revision}/{file}``);
for uploads, the calls ``create_repo`` and ``upload_folder`` make (POST ``/api/repos/create``,
``/api/validate-yaml`` for a model card, ``/api/models/{repo}/preupload/{revision}``, answered "regular" for
every file, and ``/api/models/{repo}/commit/{revision}``, whose ndjson files land in ``repos``).

Started by a test (port chosen by the OS), stopped at its end; every request is logged so tests can
check what the client asked for (``Range`` headers, how many requests).
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Set, Tuple

COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the one revision every served repository has


class FileServer:
    def __init__(self) -> None:
        self.files: Dict[str, bytes] = {}  # URL path -> bytes
        self.repos: Dict[str, Dict[str, bytes]] = {}  # Hub repo id -> file name -> bytes
        self.status: Dict[str, int] = {}  # URL path -> an error status to answer with
        self.cut_once: Set[str] = set()  # paths whose next GET stops after half the body
        self.no_range: Set[str] = set()  # paths served whole even when a range is asked for
        self.log: List[Tuple[str, str, Optional[str]]] = []  # (method, path, Range header)
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_HEAD(self) -> None:
                owner._answer(self, body=False)

            def do_GET(self) -> None:
                owner._answer(self, body=True)

            def do_POST(self) -> None:
                owner._post(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self) -> "FileServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def requests(self, path: str, method: str = "GET") -> List[Optional[str]]:
        """The Range headers of the requests made for ``path`` (None: no range)."""
        return [r for m, p, r in self.log if p == path and m == method]

    # --- answering ------------------------------------------------------------------
    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = h.path.split("?")[0]
        rng = h.headers.get("Range")
        with self._lock:
            self.log.append((h.command, path, rng))
        if path in self.status:
            return self._send(h, self.status[path], b"server error\n", {}, body)
        hub = re.match(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$", path)
        if hub:
            return self._hub(h, hub.group("repo"), hub.group("rev"), hub.group("file"), rng, body)
        if path not in self.files:
            return self._send(h, 404, b"not found\n", {}, body)
        self._serve(h, path, self.files[path], rng, {}, body)

    def _hub(self, h, repo: str, rev: str, name: str, rng: Optional[str], body: bool) -> None:
        if repo not in self.repos:
            return self._send(h, 404, b"Repository not found", {"X-Error-Code": "RepoNotFound"}, body)
        if rev not in ("main", COMMIT):
            return self._send(h, 404, b"Invalid rev id", {"X-Error-Code": "RevisionNotFound"}, body)
        files = self.repos[repo]
        if name not in files:
            return self._send(h, 404, b"Entry not found",
                              {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}, body)
        data = files[name]
        etag = hashlib.sha256(data).hexdigest()
        self._serve(h, f"/{repo}/{name}", data, rng, {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'}, body)

    def _serve(self, h, key: str, data: bytes, rng: Optional[str], extra: Dict[str, str], body: bool) -> None:
        start = 0
        m = re.match(r"bytes=(\d+)-$", rng or "")
        if m and key not in self.no_range:
            start = int(m.group(1))
            if start >= len(data):
                return self._send(h, 416, b"", {"Content-Range": f"bytes */{len(data)}"}, body)
        part = data[start:]
        headers = dict(extra, **{"Accept-Ranges": "bytes"})
        status = 200
        if start:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if body and h.path.split("?")[0] in self.cut_once:
            self.cut_once.discard(h.path.split("?")[0])
            h.send_response(status)
            for k, v in headers.items():
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(part)))
            h.end_headers()
            h.wfile.write(part[:len(part) // 2])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send(h, status, part, headers, body)

    def _post(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?")[0]
        data = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        with self._lock:
            self.log.append(("POST", path, None))
        ok = {"Content-Type": "application/json"}
        if path == "/api/repos/create":
            req = json.loads(data)
            repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
            self.repos.setdefault(repo, {})
            return self._send(h, 200, json.dumps({"url": f"{self.url}/{repo}", "name": repo}).encode(), ok, True)
        if path == "/api/validate-yaml":  # a model card's metadata block: YAML, as the Hub checks it
            import yaml
            content = json.loads(data)["content"]
            head = content.split("---")[1] if content.startswith("---") else ""
            try:
                yaml.safe_load(head)
                errors = []
            except yaml.YAMLError as err:
                errors = [{"message": str(err)}]
            return self._send(h, 400 if errors else 200, json.dumps({"errors": errors, "warnings": []}).encode(),
                              ok, True)
        m = re.match(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<op>preupload|commit)/(?P<rev>[^/]+)$", path)
        if not m or m.group("repo") not in self.repos:
            return self._send(h, 404, b"Repository not found", {"X-Error-Code": "RepoNotFound"}, True)
        repo = m.group("repo")
        if m.group("op") == "preupload":
            files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                     for f in json.loads(data)["files"]]
            return self._send(h, 200, json.dumps({"files": files}).encode(), ok, True)
        for line in data.decode().splitlines():
            item = json.loads(line)
            if item["key"] == "file":
                self.repos[repo][item["value"]["path"]] = base64.b64decode(item["value"]["content"])
        answer = {"commitUrl": f"{self.url}/{repo}/commit/{COMMIT}", "commitOid": COMMIT, "pullRequestUrl": None}
        self._send(h, 200, json.dumps(answer).encode(), ok, True)

    @staticmethod
    def _send(h, status: int, data: bytes, headers: Dict[str, str], body: bool) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)
