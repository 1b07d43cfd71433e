"""The one storage layer: which paths are remote, atomic writes, finding files, and the GCS emulator.

Every path of the project (run records, leases, metrics, checkpoints, the
token cache, the analysis) is an ``etils.epath.Path``, local or ``gs://``.
What epath cannot say is here, and only here, written with the fsspec
filesystem under it: an upload in one request (``write_atomic``), one
listing of a whole tree (``find``) or of a folder's sizes (``file_sizes``),
exact byte ranges fetched together (``read_ranges``), moving a folder, and
copying a local folder there (``copy_folder_to``).
``gs://`` paths reach Cloud Storage through three client stacks:

- ``etils.epath`` (and fsspec, here) through **gcsfs** (records, metrics, token cache, analysis);
- **google-cloud-storage** (the lease's generation preconditions; orbax asks it about the bucket);
- **tensorstore**'s own GCS driver (orbax's array data).

``STORAGE_EMULATOR_HOST`` (e.g. ``http://127.0.0.1:4443``, the variable
google-cloud-storage and gcsfs read) alone points all three at a local
emulator such as fake-gcs-server: ``use_emulator`` maps it, here and only
here, to what the others read:

- tensorstore: ``TENSORSTORE_GCS_HTTP_URL`` (its documented test endpoint)
  and ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` (any token; an emulator checks none);
- gcsfs: its plain ``GCSFileSystem``. Recent gcsfs installs an "extended"
  filesystem that first asks a gRPC control-plane API for the bucket's
  layout and falls back only after a 60 s timeout, which an emulator never
  answers; ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (read when gcsfs is
  imported) and registering ``gcsfs.core.GCSFileSystem`` for ``gs``/``gcs``
  (for a gcsfs imported already) both turn that off.

Every command line calls ``use_emulator`` first (``entry.py``; importing
``scaling`` does not); it changes nothing unless ``STORAGE_EMULATOR_HOST``
is set. A process that sets the variable later (the test fixture) calls it again.

Every command line that takes a ``gs://`` path first calls ``check_access``:
one listing request per bucket with a timeout of seconds and no retries, so an
unreachable storage, refused credentials or a missing bucket is one line
(``StorageAccessError``) instead of a minute of retries and tracebacks from
the clients above, each of which retries on its own.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path

EMULATOR_VARIABLE = "STORAGE_EMULATOR_HOST"
CLOUD_STORAGE_URL = "https://storage.googleapis.com"  # what gcsfs and google-cloud-storage reach without an emulator
PROBE_TIMEOUT_S = 5.0  # per step of check_access; a healthy bucket answers in well under a second


def is_remote(path) -> bool:
    """True for a URI such as ``gs://bucket/key`` (an object store), False for a local path."""
    return "://" in os.fspath(path)


def write_atomic(path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never part of one.

    Local: a temporary file beside it, flushed to disk, then renamed over it.
    Object stores: one object upload, which they make visible whole or not at all. It goes
    through fsspec's ``pipe_file``: gcsfs sends an object under 50 MB in one request and
    retries it whole on connection errors, where a file object's resumable upload session
    would be lost with a restarting server (its retry then meets 404).
    """
    from etils import epath

    data = data.encode() if isinstance(data, str) else data
    if is_remote(path):
        fs, key = _filesystem(os.fspath(path))
        fs.pipe_file(key, data)
        return
    path = epath.Path(path)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _filesystem(path: str):
    """The fsspec filesystem of ``path`` and the path as that filesystem names it."""
    import fsspec

    return fsspec.core.url_to_fs(path)


def find(root, name: str) -> list:
    """Every file called ``name`` at any depth under the folder ``root``, as ``etils.epath.Path``s, sorted.

    Object stores: one recursive listing of the prefix (a request per 1000
    objects), not a request per folder as a walk would make. The paths
    keep the form the caller gave ``root`` in (``gs://...`` stays so).
    """
    from etils import epath

    text = os.fspath(root).rstrip("/") or "/"
    if not is_remote(text):
        return [epath.Path(p) for p in sorted(glob.glob(os.path.join(glob.escape(text), "**", name),
                                                        recursive=True))]
    fs, key = _filesystem(text)
    key = key.rstrip("/")
    found = sorted(p for p in fs.find(key) if p.rsplit("/", 1)[-1] == name)
    return [epath.Path(text + p[len(key):]) for p in found]


def file_sizes(folder) -> dict[str, int]:
    """Name -> size (bytes) of every file directly in ``folder``, from one fresh listing (a request on
    an object store; gcsfs would otherwise answer from a listing it cached earlier)."""
    fs, key = _filesystem(os.fspath(folder))
    return {entry["name"].rstrip("/").rsplit("/", 1)[-1]: int(entry["size"])
            for entry in fs.ls(key, detail=True, refresh=True) if entry["type"] == "file"}


def read_text(path) -> str:
    """The text of the file ``path``; on an object store one request for the whole object, answered by the
    server (not by a size gcsfs cached in an earlier listing, stale once another writer replaced it)."""
    if not is_remote(path):
        return Path(os.fspath(path)).read_text()
    fs, key = _filesystem(os.fspath(path))
    return fs.cat_file(key).decode()


def read_ranges(paths: Sequence, starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
    """Bytes ``[start, end)`` of each of ``paths`` (all on one filesystem): on an object store one
    exact range request each, all sent at once, where a file object would read megabytes ahead per seek."""
    if not paths:
        return []
    fs, _ = _filesystem(os.fspath(paths[0]))
    keys = [_filesystem(os.fspath(path))[1] for path in paths]
    return fs.cat_ranges(keys, list(starts), list(ends), on_error="raise")


def move_folder(source, destination) -> None:
    """Move the folder ``source`` (with everything under it) to ``destination``, which must not exist.

    Local: one rename. Object stores have no folders, only objects whose
    names share a prefix: every object is copied to the new prefix, then the
    old ones are deleted (gcsfs's recursive ``mv``). ``epath``'s ``rename``
    cannot be used there: it refuses unless the destination's parent
    "folder" exists, and on Cloud Storage an empty folder does not.
    """
    if not is_remote(source):
        os.makedirs(os.path.dirname(os.fspath(destination)), exist_ok=True)
        shutil.move(os.fspath(source), os.fspath(destination))
        return
    fs, source_path = _filesystem(os.fspath(source))
    _, destination_path = _filesystem(os.fspath(destination))
    if fs.exists(destination_path):
        raise FileExistsError(f"{destination} already exists; cannot move {source} there")
    fs.mv(source_path, destination_path, recursive=True)
    fs.invalidate_cache()


def copy_folder_to(source, destination) -> None:
    """Copy the local folder ``source`` (with everything under it) to ``destination``, local or an object
    store's prefix (one upload per file; what is there already is replaced)."""
    if not is_remote(destination):
        shutil.copytree(os.fspath(source), os.fspath(destination), dirs_exist_ok=True)
        return
    fs, destination_path = _filesystem(os.fspath(destination))
    fs.put(os.fspath(source).rstrip("/") + "/", destination_path.rstrip("/") + "/", recursive=True)
    fs.invalidate_cache()


def emulator_url(environ=None) -> str | None:
    """``STORAGE_EMULATOR_HOST`` with a scheme (``http://`` if it has none), or None when unset."""
    environ = os.environ if environ is None else environ
    host = (environ.get(EMULATOR_VARIABLE) or "").strip().rstrip("/")
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def use_emulator(environ=None) -> str | None:
    """Point tensorstore and gcsfs where ``STORAGE_EMULATOR_HOST`` points (see the module docstring).

    Returns the emulator's URL, or None (and changes nothing) when the variable is unset.
    """
    environ = os.environ if environ is None else environ
    url = emulator_url(environ)
    if url is None:
        return None
    environ[EMULATOR_VARIABLE] = url
    environ["TENSORSTORE_GCS_HTTP_URL"] = url
    environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
    environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    if environ is os.environ:
        try:
            import fsspec
            from gcsfs.core import GCSFileSystem  # the plain one (gcsfs reads the variable above on import)
        except ImportError:  # no gcsfs: gs:// paths fail later with fsspec's own message
            return url
        for protocol in ("gs", "gcs"):
            fsspec.register_implementation(protocol, GCSFileSystem, clobber=True)
        GCSFileSystem.clear_instance_cache()  # instances made earlier may point elsewhere
        from etils.epath import backend

        backend.fsspec_backend._get_filesystem.cache_clear()  # epath keeps the filesystem it made
    return url


class StorageAccessError(OSError):
    """A ``gs://`` path whose bucket cannot be used: storage unreachable, credentials refused, or no such
    bucket. The message is one line naming the path and the likely cause."""


def check_access(*paths, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise ``StorageAccessError`` unless the bucket of every ``gs://`` path answers a one-object listing.

    Each bucket is asked once, with no retries: a TCP connection to the storage
    (name lookup included) within ``timeout_s`` seconds, then one listing
    request of the path's prefix within ``timeout_s`` seconds, sent with the
    credentials gcsfs uses (none to an emulator). A listing, not the bucket's
    metadata, because listing is what the project needs: object-level roles
    may list a bucket they may not describe. Local paths, other schemes and
    empty values pass unchecked, so callers may pass every path argument.
    """
    asked = set()
    for path in paths:
        text = os.fspath(path) if path else ""
        scheme, _, rest = text.partition("://")
        bucket, _, key = rest.partition("/")
        if scheme not in ("gs", "gcs") or not bucket or bucket in asked:
            continue
        asked.add(bucket)
        _probe_bucket(text, bucket, key, timeout_s)


def _probe_bucket(path: str, bucket: str, key: str, timeout_s: float) -> None:
    emulator = emulator_url()
    endpoint = emulator or CLOUD_STORAGE_URL
    hint = f"is {EMULATOR_VARIABLE} right?" if emulator else "is the network up?"
    parts = urllib.parse.urlsplit(endpoint)
    failure = _connect(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80), timeout_s)
    if failure:
        raise StorageAccessError(f"{path}: cannot reach Cloud Storage at {endpoint} ({failure}; {hint})")
    # Credentials only now: finding them can take seconds (gcsfs asks a GCE metadata server), and an
    # unreachable storage needs none. Through epath's own filesystem instance, so they are found once.
    headers = {} if emulator else _credential_headers(path)
    query = urllib.parse.urlencode({"maxResults": 1, "prefix": key.rstrip("/"), "fields": "kind"})
    request = urllib.request.Request(f"{endpoint}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?{query}",
                                     headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # gcsfs's aiohttp uses no proxy either
    try:
        with opener.open(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError as error:
        raise StorageAccessError(_refusal(path, bucket, endpoint, error.code, _server_message(error))) from None
    except urllib.error.URLError as error:
        failure = _failure(error.reason, parts.hostname, timeout_s)
    except OSError as error:  # a timeout while reading the answer, a reset connection
        failure = _failure(error, parts.hostname, timeout_s)
    raise StorageAccessError(f"{path}: cannot reach Cloud Storage at {endpoint} ({failure}; {hint})")


def _connect(host: str, port: int, timeout_s: float) -> str | None:
    """Why a TCP connection to ``host:port`` failed within ``timeout_s`` seconds, or None if it opened.

    In a thread, because the name lookup inside ``create_connection`` heeds no timeout.
    """
    errors: list[OSError] = []

    def attempt():
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError as error:
            errors.append(error)

    thread = threading.Thread(target=attempt, name="storage-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return f"no answer within {timeout_s:g} s"
    return _failure(errors[0], host, timeout_s) if errors else None


def _failure(error, host, timeout_s: float) -> str:
    """A few words for a connection error: what a user can act on, not the exception's class."""
    if isinstance(error, socket.gaierror):
        return f"the name {host} does not resolve"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, TimeoutError):  # socket.timeout is TimeoutError
        return f"no answer within {timeout_s:g} s"
    return (getattr(error, "strerror", None) or str(error) or type(error).__name__).strip()


def _credential_headers(path: str) -> dict:
    """The authorisation headers gcsfs would send (none for anonymous access)."""
    try:
        import fsspec

        filesystem = fsspec.filesystem("gcs", finalize_on_close=True)  # the instance etils.epath makes
        headers: dict = {}
        filesystem.credentials.apply(headers)  # refreshes an expired token
        return headers
    except ImportError:
        return {}
    except Exception as error:  # noqa: BLE001 - google-auth raises several kinds; all mean the same here
        raise StorageAccessError(
            f"{path}: no usable Google Cloud credentials ({' '.join(str(error).split())[:200]}); run "
            "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS") from None


def _refusal(path: str, bucket: str, endpoint: str, code: int, message: str) -> str:
    """The one line for an HTTP error answer to the listing."""
    said = f"HTTP {code}" + (f": {message}" if message else "")
    if code == 401:
        return (f"{path}: Cloud Storage at {endpoint} wants valid credentials ({said}); run "
                "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS")
    if code == 403:
        return (f"{path}: the credentials in use may not list bucket {bucket} ({said}); grant them "
                "storage.objects.list on it (e.g. roles/storage.objectAdmin) or use other credentials")
    if code == 404:
        return (f"{path}: no such bucket {bucket} at {endpoint} ({said}); create it first, e.g. "
                f"`gcloud storage buckets create gs://{bucket}`")
    return f"{path}: Cloud Storage at {endpoint} refused to list bucket {bucket} ({said})"


def _server_message(error: urllib.error.HTTPError) -> str:
    """The storage's own explanation from an error answer (JSON ``error.message``, else its text), one line."""
    try:
        body = error.read(4096).decode("utf-8", "replace")
    except OSError:
        return ""
    try:
        body = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    return " ".join(str(body).split())[:200]
