"""A lease per run directory, so that two launchers never train the same run at once.

Before training, a process takes the run's lease: the file ``<run dir>/lease.json``,
created only if absent, holding the holder's host, pid, a random token and a
heartbeat time that a background thread renews. Another process that finds a
live lease skips the run (``RunBusy``); one whose heartbeat is older than
``stale_seconds``, or whose holder is a dead process on this same host, is
taken over. A holder whose lease was taken over (it was thought dead) notices
at its next heartbeat and stops writing to the run (``lease.lost``).

How "create only if absent" is made atomic:
- local and network filesystems: ``open(O_CREAT | O_EXCL)``, which POSIX
  makes atomic and NFS v3+ honours. The heartbeat is the file's modification
  time (renewing touches it, never rewrites it). A stale lease is first
  renamed away (only one of several racing processes can rename it), checked
  to be unchanged since it was read, then created anew.
- ``gs://``: a Cloud Storage upload with the precondition
  ``if_generation_match=0`` (create only if no object exists) and, to
  renew or take over, ``if_generation_match=<the generation read>``; these
  are the storage's own compare-and-swap, so no lock service is needed.
  A conditional write whose reply was lost is recognised as our own (see
  ``_GcsStore``), and the lease is deleted only at the generation read.
  Tested against fake-gcs-server (tests/test_lease.py, tests/test_storage_faults.py), not Cloud Storage.
- other object stores (fsspec ``memory://`` in tests, s3, ...): best effort,
  write then read back the token; a race inside one round trip can still
  let two processes in.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid

from scaling.store.storage import is_remote

LEASE_FILE = "lease.json"
STALE_SECONDS = 300.0  # a lease whose heartbeat is older than this is presumed abandoned
HEARTBEAT_SECONDS = 30.0


class RunBusy(Exception):
    """Another live process holds this run's lease."""


class Lease:
    """The lease of one run directory. Use ``acquire()`` then ``release()`` (or ``with``)."""

    def __init__(self, run_dir, *, stale_seconds: float = STALE_SECONDS,
                 heartbeat_seconds: float = HEARTBEAT_SECONDS):
        self.run_dir = str(run_dir)
        self.path = self.run_dir.rstrip("/") + "/" + LEASE_FILE
        self.stale_seconds = stale_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.token = uuid.uuid4().hex
        self.lost = False  # set by the heartbeat when another process has taken the lease over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store = _store_for(self.path)

    def _content(self) -> str:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": self.token,
                           "heartbeat": time.time()})

    def holder(self) -> dict | None:
        """The current lease's content (host, pid, token, heartbeat), or None if there is none."""
        found = self._store.read(self.path)
        return None if found is None else found[0]

    def acquire(self) -> "Lease":
        """Take the lease, taking over a stale one; raises ``RunBusy`` naming the live holder."""
        for _ in range(3):
            if self._store.create(self.path, self._content()):
                self._start_heartbeat()
                return self
            found = self._store.read(self.path)
            if found is None:
                continue  # released between our two calls: try again
            holder, version = found
            if not self._is_stale(holder):
                raise RunBusy(f"{self.run_dir} is being trained by {holder.get('host')} pid {holder.get('pid')} "
                              f"(heartbeat {time.time() - float(holder.get('heartbeat', 0)):.0f} s ago)")
            if self._store.take_over(self.path, version, self._content()):
                self._start_heartbeat()
                return self
        raise RunBusy(f"{self.run_dir}: could not take the lease (other processes are racing for it)")

    def _is_stale(self, holder: dict) -> bool:
        age = time.time() - float(holder.get("heartbeat", 0))
        if age > self.stale_seconds:
            return True
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            return not _alive(holder["pid"])
        return False

    def _start_heartbeat(self) -> None:
        self.lost = False
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        last_renewed = time.time()
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                found = self._store.read(self.path)
                if found is None or found[0].get("token") != self.token:
                    self.lost = True
                    return
                if not self._store.renew(self.path, found[1], self._content()):
                    self.lost = True
                    return
                last_renewed = time.time()
            except Exception:  # noqa: BLE001 - a storage hiccup (503, NFS timeout): retry at the next beat
                if time.time() - last_renewed > self.stale_seconds / 2:
                    self.lost = True  # others will soon see the lease as stale: stop before they take it
                    return

    def still_held(self) -> bool:
        """Read the lease now: True if it is still this process's (False after any error reading it)."""
        if self.lost:
            return False
        try:
            found = self._store.read(self.path)
        except Exception:  # noqa: BLE001 - cannot tell: treat as lost rather than risk two writers
            return False
        held = found is not None and found[0].get("token") == self.token
        if found is not None and not held:
            self.lost = True  # another process's token: taken over for good
        return held

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        found = self._store.read(self.path)
        if found is not None and found[0].get("token") == self.token:
            self._store.delete(self.path, found[1])

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _parse(text: str, modified: float) -> dict:
    try:
        value = json.loads(text)
        if isinstance(value, dict):
            return value
    except json.JSONDecodeError:
        pass
    return {"heartbeat": modified}  # unreadable (a holder died mid-write): as old as the file


class _LocalStore:
    """Atomic create and compare-and-swap on a POSIX filesystem."""

    def create(self, path: str, text: str) -> bool:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        return True

    def read(self, path: str):
        # The version is the content and modification time read through one
        # handle: a renewal changes the time, a takeover the content.
        try:
            with open(path) as handle:
                text = handle.read()
                modified_ns = os.fstat(handle.fileno()).st_mtime_ns
        except FileNotFoundError:
            return None
        holder = _parse(text, modified_ns / 1e9)
        holder["heartbeat"] = modified_ns / 1e9  # renewals touch the file (see renew)
        return holder, (text, modified_ns)

    def take_over(self, path: str, version, text: str) -> bool:
        # Rename the lease we read away (only one racer can), check it is the
        # one we read, then create a new one exclusively.
        aside = f"{path}.{uuid.uuid4().hex[:8]}.old"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        with open(aside) as handle:
            found = (handle.read(), os.fstat(handle.fileno()).st_mtime_ns)
        if found != version:  # renewed or replaced since we read it: put it back untouched
            try:
                os.link(aside, path)
            except FileExistsError:
                pass
            os.remove(aside)
            return False
        os.remove(aside)
        return self.create(path, text)

    def renew(self, path: str, version, text: str) -> bool:
        # Touch, never rewrite: the lease file keeps its content and inode, so a
        # renewal racing a takeover can at worst refresh the successor's lease,
        # and the old holder sees the successor's token at its next check.
        if _parse(version[0], 0.0).get("token") != json.loads(text)["token"]:
            return False
        try:
            os.utime(path)
        except FileNotFoundError:
            return False
        return True

    def delete(self, path: str, version=None) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


class _GcsStore:
    """Generation preconditions of Cloud Storage: create-if-absent and compare-and-swap.

    google-cloud-storage retries a conditional upload whose reply was lost
    (a dropped connection, a 503 after the write took effect); the retry
    then fails its own precondition (412) although the first attempt
    succeeded. So a 412 is checked: if the object now holds exactly the
    text this process just wrote (it carries our token and a fresh
    heartbeat time), the write was ours and it counts as done.
    """

    def __init__(self, path: str):
        # google-cloud-storage, not epath/gcsfs: gcsfs can only create-if-absent, not write or delete at a generation.
        from google.cloud import storage

        bucket, _, self.name = path[len("gs://"):].partition("/")
        self.bucket = storage.Client().bucket(bucket)

    def _upload(self, text: str, generation: int) -> bool:
        from google.api_core import exceptions

        try:
            self.bucket.blob(self.name).upload_from_string(text, if_generation_match=generation)
            return True
        except exceptions.PreconditionFailed:
            blob = self.bucket.get_blob(self.name)
            return blob is not None and blob.download_as_text() == text  # our write, its reply lost

    def create(self, path: str, text: str) -> bool:
        return self._upload(text, 0)

    def read(self, path: str):
        from google.api_core import exceptions

        blob = self.bucket.get_blob(self.name)
        if blob is None:
            return None
        try:
            text = blob.download_as_text(if_generation_match=blob.generation)  # the version we report
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            return self.read(path)  # replaced or deleted between the two requests: read it again
        return _parse(text, blob.updated.timestamp() if blob.updated else 0.0), blob.generation

    def take_over(self, path: str, version, text: str) -> bool:
        return self._upload(text, version)

    renew = take_over

    def delete(self, path: str, version=None) -> None:
        """Delete the lease, only if still at generation ``version`` (when given): never a successor's."""
        from google.api_core import exceptions

        try:
            self.bucket.blob(self.name).delete(if_generation_match=version)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            pass


class _BestEffortStore:
    """Any other fsspec store: write, then read back our token."""

    def __init__(self, path: str):
        from etils import epath

        self._path = epath.Path(path)

    def create(self, path: str, text: str) -> bool:
        if self._path.exists():
            return False
        self._path.write_text(text)
        return json.loads(self._path.read_text()).get("token") == json.loads(text)["token"]

    def read(self, path: str):
        if not self._path.exists():
            return None
        text = self._path.read_text()
        return _parse(text, 0.0), text

    def take_over(self, path: str, version, text: str) -> bool:
        if not self._path.exists() or self._path.read_text() != version:
            return False
        self._path.write_text(text)
        return True

    renew = take_over

    def delete(self, path: str, version=None) -> None:
        if self._path.exists():
            self._path.unlink()


def _store_for(path: str):
    if path.startswith("gs://"):
        try:
            return _GcsStore(path)
        except Exception as error:  # noqa: BLE001 - no client library, or no credentials: say so, go on
            import sys

            print(f"warning: leases on gs:// are best effort here ({type(error).__name__}: {error}; "
                  "google-cloud-storage from the tpu extra and credentials give exact ones): two launchers "
                  "racing within one round trip could both train a run", file=sys.stderr)
            return _BestEffortStore(path)
    if is_remote(path):
        return _BestEffortStore(path)
    return _LocalStore()
