"""The one storage layer: which paths are remote, atomic writes, finding files, and the GCS emulator.

Every path of the project (run records, leases, metrics, checkpoints, the
token cache, the analysis) is an ``etils.epath.Path``, local or ``gs://``.
What epath cannot say is here, and only here, written with the fsspec
filesystem under it: an upload in one request (``write_atomic``), one
listing of a whole tree (``find``) or of a folder's sizes (``file_sizes``),
exact byte ranges fetched together (``read_ranges``), and moving a folder.
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

Importing ``scaling`` calls ``use_emulator`` once; it changes nothing unless
``STORAGE_EMULATOR_HOST`` is set. A process that sets the variable later
(the test fixture) calls it again.
"""

from __future__ import annotations

import glob
import os
import shutil
import uuid
from collections.abc import Sequence

EMULATOR_VARIABLE = "STORAGE_EMULATOR_HOST"


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
