"""Helpers that many test modules share: the checkout's root, a free port, a stub HTTP server, a clean
environment, and the one way the tests run the project's commands in a child process.

Test modules import it as ``import helpers`` (pytest puts ``tests/`` on ``sys.path``, as for
``tiny.py``). It imports nothing of the project, so importing it costs nothing; what needs the
trainer (a paused trainer, a run's final parameters) is in ``tiny.py``, and shared fixtures are in
``conftest.py``.

The runner, ``run`` (and ``run_module``, ``run_python``), always captures text output, starts the
child in the checkout's root, and gives it a timeout, so a hung child fails its test instead of the
suite. Tests that must signal or pause a child, or run several at once, ``start`` it and ``finish``
it.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Seconds a command may run before its test fails: generous, because a launcher that trains a few
# tiny runs takes about a minute alone but over five beside two other training jobs on 2 cores.
DEFAULT_TIMEOUT = 900

# Variables that tell a process which cluster, slice or host it is part of: a test's child must not
# inherit them from a shell that happens to run on a TPU VM or inside a SLURM job.
CLUSTER_VARIABLES = ("TPU_", "SLURM_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "GCE_METADATA")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (free when asked; nothing holds it after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve_http(answer, content_type: str | None = None):
    """A stub HTTP server on 127.0.0.1 for the ``with`` block: yields its ``host:port``. Every GET is
    answered by ``answer(path, headers)``, which returns (status, body bytes); with ``content_type``,
    every answer says so."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            status, body = answer(self.path, self.headers)
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without ``CLUSTER_VARIABLES``, with ``extra`` set."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(CLUSTER_VARIABLES)}
    env.update(extra)
    return env


def with_checkout(env=None, **extra: str) -> dict[str, str]:
    """``env`` (default this process's environment) with ``extra`` set and this checkout first on
    ``PYTHONPATH``, so a child imports these packages whatever its working directory and whatever
    is installed."""
    env = {**(os.environ if env is None else env), **extra}
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path and path != str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *paths])
    return env


def module_command(module: str, *arguments) -> list[str]:
    """``python -m module arguments`` with this interpreter (arguments made strings)."""
    return [sys.executable, "-m", module, *map(str, arguments)]


def run(command: list, *, env=None, cwd=REPO, timeout: float = DEFAULT_TIMEOUT,
        check: bool = False) -> subprocess.CompletedProcess:
    """Run ``command`` to its end: its exit status and text output (``stdout``, ``stderr``).

    ``env`` is the child's whole environment (default: this process's, ``with_checkout``); ``cwd``
    its working directory (default: the checkout's root); ``timeout`` in seconds. Its standard
    input is empty, so a command that waits for input ends instead of hanging. ``check``: fail the
    test, with the end of the output, unless the command exits 0.
    """
    done = subprocess.run([str(part) for part in command], env=with_checkout() if env is None else env, cwd=cwd,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, (f"{' '.join(done.args)} exited with {done.returncode}\n"
                                      f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def run_module(module: str, *arguments, **options) -> subprocess.CompletedProcess:
    """``python -m module arguments`` to its end (``run``'s ``options``)."""
    return run(module_command(module, *arguments), **options)


def run_python(code: str, *arguments, **options) -> subprocess.CompletedProcess:
    """``python -c code arguments`` to its end (``run``'s ``options``)."""
    return run([sys.executable, "-c", code, *map(str, arguments)], **options)


def start(command: list, *, env=None, cwd=REPO, merge_stderr: bool = False, **popen) -> subprocess.Popen:
    """Start ``command`` and return at once: a child to signal, wait for or ``finish``. Its output comes
    through text pipes (``stderr`` into ``stdout`` with ``merge_stderr``); ``env`` and ``cwd`` as
    for ``run``; ``popen``: more of ``subprocess.Popen``'s arguments (``start_new_session``...)."""
    return subprocess.Popen([str(part) for part in command], env=with_checkout() if env is None else env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                            text=True, **popen)


def finish(processes: list[subprocess.Popen],
           timeout: float = DEFAULT_TIMEOUT) -> list[subprocess.CompletedProcess]:
    """Wait for ``processes`` (from ``start``) to end, each within ``timeout`` seconds: their exit
    statuses and output, in order. Any still running when this fails is killed."""
    try:
        outputs = [process.communicate(timeout=timeout) for process in processes]
        return [subprocess.CompletedProcess(process.args, process.returncode, *output)
                for process, output in zip(processes, outputs)]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def assert_shellcheck_clean(script: Path, *options: str) -> None:
    """``shellcheck options script`` finds nothing; skipped where the shellcheck binary is missing."""
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck binary not installed (apt-get install shellcheck); CI installs it")
    done = run(["shellcheck", *options, script])
    assert done.returncode == 0, done.stdout + done.stderr
