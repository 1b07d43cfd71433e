"""A disk cache of the TPU compiler's answers for the preflight, so a repeated preflight compiles only what changed.

A TPU compile of one train step takes 30 to 70 s on a 2-core machine, almost
all of it in libtpu's backend passes, and the preflight compiles one program
per distinct shape of a sweep. Editing one run of a sweep and checking it
again should not pay for the others a second time.

JAX's own persistent compilation cache cannot help: it stores executables,
and an executable compiled ahead of time for a TPU slice that is not attached
cannot be loaded back. What the preflight reads from a compile is smaller:
the optimized HLO text (``as_text()``) and the buffer sizes
(``memory_analysis()``), or the compiler's out-of-memory message. This cache
stores exactly those, gzipped JSON, one file per program (about 0.2 MB).

The key is a SHA-256 of everything the compiler's answer depends on: the
lowered program's text (StableHLO with its shardings and mesh, so any change
to the model, the config or the code that builds the step changes it), the
slice, and the versions of jax, jaxlib and libtpu. Everything computed from
the answer (roofline, MFU, fit verdict, suggestions) is recomputed on every
preflight, so a change to that code needs no new compile.

    SCALING_PREFLIGHT_CACHE=off python -m sweeps.launch preflight ...   # compile everything afresh
    python -m sweeps.launch preflight ... --compile-cache /tmp/cache    # somewhere else than the default
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib.metadata
import json
import os
import types

from scaling.store.storage import write_atomic

VARIABLE = "SCALING_PREFLIGHT_CACHE"
MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                 "peak_memory_in_bytes")


def default_directory(option: str | None = None, environ=None) -> str | None:
    """The cache directory, or None for no cache: ``option`` (``--compile-cache``; "off" for none), else
    ``$SCALING_PREFLIGHT_CACHE``, else ``$XDG_CACHE_HOME/scaling/preflight`` (~/.cache/...)."""
    environ = os.environ if environ is None else environ
    chosen = option if option is not None else environ.get(VARIABLE)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "none") else chosen
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "scaling", "preflight")


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def program_key(lowered_text: str, topology_name: str) -> str:
    """The cache key (64 hex digits) of one lowered program compiled for the slice ``topology_name``."""
    digest = hashlib.sha256()
    for part in (topology_name, _version("jax"), _version("jaxlib"), _version("libtpu"), lowered_text):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class CachedCompile:
    """The parts of a compiled executable the preflight reads, as a stored compile gave them."""

    hlo_text: str
    memory: dict

    def as_text(self) -> str:
        return self.hlo_text

    def memory_analysis(self):
        return types.SimpleNamespace(**self.memory)


class CachedCompileError(RuntimeError):
    """A compile that failed when it was stored (e.g. RESOURCE_EXHAUSTED), raised again with the compiler's words."""


def _stored_error(type_name: str, message: str) -> CachedCompileError:
    # Named as the compiler's exception was, so a report's "<Type>: <message>" reads the same.
    return type(type_name, (CachedCompileError,), {})(message)


class CompileCache:
    """Compile lowered programs through a directory of stored answers (``None``: no cache, always compile)."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self.hits = 0

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, f"{key}.json.gz")

    def compile(self, lowered, topology_name: str, is_out_of_memory):
        """``lowered.compile()``, or the stored answer for the same program and slice.

        Returns the executable (a fresh compile) or a ``CachedCompile``; raises
        the compile's exception, or ``CachedCompileError`` with its stored
        message. Only answers that depend on the program alone are stored: a
        success, or an error for which ``is_out_of_memory(error)`` is true.
        """
        if self.directory is None:
            return lowered.compile()
        key = program_key(lowered.as_text(), topology_name)
        stored = self._load(key)
        if stored is not None:
            self.hits += 1
            if "error" in stored:
                raise _stored_error(stored.get("error_type", "CachedCompileError"), stored["error"])
            return CachedCompile(stored["hlo_text"], stored["memory"])
        try:
            compiled = lowered.compile()
        except Exception as error:
            if is_out_of_memory(error):
                self._store(key, {"error": str(error), "error_type": type(error).__name__})
            raise
        stats = compiled.memory_analysis()
        self._store(key, {"hlo_text": compiled.as_text(),
                          "memory": {name: int(getattr(stats, name, 0) or 0) for name in MEMORY_FIELDS}})
        return compiled

    def _load(self, key: str) -> dict | None:
        try:
            with gzip.open(self._path(key), "rt") as handle:
                return json.load(handle)
        except (OSError, EOFError, ValueError):  # absent, or unreadable: compile again
            return None

    def _store(self, key: str, answer: dict) -> None:
        try:
            os.makedirs(self.directory, exist_ok=True)
            write_atomic(self._path(key), gzip.compress(json.dumps(answer).encode(), compresslevel=6))
        except OSError:  # a read-only or full disk costs a later recompile, never this preflight
            pass
