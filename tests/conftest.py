"""Shared test set-up.

JAX fixes its device list when its backend starts, so the 8 fake CPU devices
that the sharding tests need are requested here, before any test imports a
module that touches a device. Single-device code is unaffected: unsharded
arrays live on device 0. Tests that need the 8 devices take the
``eight_devices`` fixture, which hands them the device list.
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The preflight keeps TPU compiles in ~/.cache by default; tests compile afresh unless they say otherwise.
os.environ.setdefault("SCALING_PREFLIGHT_CACHE", "off")

# Most tests train the same few tiny shapes, many of them in launcher and trainer
# subprocesses, which would otherwise each compile them again; XLA compiling
# dominates the suite's time. One persistent compilation cache per test session,
# inherited by those subprocesses and by pytest-xdist's workers, compiles each
# program once. It starts empty and is deleted at the end, so no run of the
# suite depends on an earlier one.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _compilation_cache = tempfile.mkdtemp(prefix="scaling-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _compilation_cache
    atexit.register(shutil.rmtree, _compilation_cache, ignore_errors=True)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

# XLA's CPU backend spends most of a compile in LLVM's optimisation passes and its fusion emitters,
# which buy nothing for programs this small and short-lived: the tests compile at -O0 with the older
# element-wise emitters and one codegen split, a quarter of the default compile time for the tiny
# trainer's programs (4.7 -> 0.9 s). The subprocesses inherit the flags (tests/tiny.py keeps them when
# it sets their device count). XLA aborts the process on a flag it does not know, so a newer jaxlib that
# dropped one is probed first, in a child process, and then only -O0 is used.
_FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
                 "--xla_cpu_parallel_codegen_split_count=1")


def _xla_accepts(flags: str) -> bool:
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, timeout=120,
                           env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags})
    return probe.returncode == 0


if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    _flags = (os.environ.get("XLA_FLAGS", "") + " " + " ".join(_FAST_COMPILE)).strip()
    if not _xla_accepts(_flags):
        _flags = (os.environ.get("XLA_FLAGS", "") + " " + _FAST_COMPILE[0]).strip()
    os.environ["XLA_FLAGS"] = _flags

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture
def eight_devices():
    devices = jax.devices()
    if len(devices) < 8:
        pytest.fail(f"expected 8 fake CPU devices, found {len(devices)}; is the backend started before conftest?")
    return devices[:8]


@pytest.fixture(scope="session")
def tiny_reference(tmp_path_factory):
    """``tiny.config()`` trained once, undisturbed, in this process: (run directory, run record).
    Tests that damage or interrupt a run copy it (``shutil.copytree``) instead of training again."""
    import tiny

    run_dir = tmp_path_factory.mktemp("tiny-reference") / "run"
    return run_dir, tiny.run(tiny.config(), run_dir)


@pytest.fixture
def own_cache_home(tmp_path, monkeypatch):
    """Caches built on first use (token caches with ``data.cache_dir`` unset, trained tokenizers) go
    under this test's directory: ``XDG_CACHE_HOME`` is set for the test; the project's folder in it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "scaling-data"


# ---------------------------------------------------------------------------
# A local Cloud Storage (fake-gcs-server from the dev extra; see tests/gcs_emulator.py)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """fake-gcs-server on 127.0.0.1 at a free port for this test session (per xdist worker)."""
    from gcs_emulator import Emulator

    folder = tmp_path_factory.mktemp("gcs-emulator")
    server = Emulator(folder / "objects", folder / "server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def gcs(gcs_emulator, monkeypatch, tmp_path):
    """A fresh, empty bucket on the emulator: its ``gs://`` URL. ``STORAGE_EMULATOR_HOST`` points at the
    emulator for the test (and the processes it starts); the test runs in an empty local directory,
    and nothing may land there."""
    import uuid

    from scaling.store import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.url)
    for name in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"):
        monkeypatch.delenv(name, raising=False)  # restored after the test; use_emulator sets them from the above
    storage.use_emulator()
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    gcs_emulator.create_bucket(bucket)
    local = tmp_path / "cwd"
    local.mkdir()
    monkeypatch.chdir(local)
    yield f"gs://{bucket}"
    leftovers = [p.name for p in local.iterdir()]
    assert not leftovers, f"files landed on the local disk: {leftovers}"
