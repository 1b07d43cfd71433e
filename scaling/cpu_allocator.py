"""Glibc allocator tuning for XLA:CPU, applied explicitly by the command lines (never on import)."""

from __future__ import annotations

import os


def reuse_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the kernel.

    XLA:CPU allocates each step's temporary buffers afresh (about 230 MiB for
    L=4, d=256) on its worker threads; glibc serves blocks that large with
    mmap and unmaps them on free, so every step paid a page fault per 4 KiB
    touched: a quarter of the CPU time of a train step. One malloc arena, no
    mmap and a 2 GiB trim threshold let later steps reuse already-mapped
    pages (the process keeps its peak memory). It only takes effect before
    JAX starts its CPU threads; ``tune_cpu_allocator`` decides whether to call it.
    Returns False where glibc's ``mallopt`` is not available.
    """
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    trim_threshold, mmap_max, arena_max = -1, -4, -8  # glibc's M_* parameter numbers
    return bool(mallopt(arena_max, 1) and mallopt(mmap_max, 0) and mallopt(trim_threshold, 2**31 - 1))


def tune_cpu_allocator() -> bool:
    """Call ``reuse_freed_memory`` when JAX will run on the CPU; the command lines call this first.

    Skipped (returns False) when ``SCALING_MALLOC_TUNING=0``, or when an
    accelerator plugin (libtpu, CUDA) is installed and ``JAX_PLATFORMS`` does
    not ask for the CPU, since there the host allocator serves other work.
    """
    import importlib.util

    if os.environ.get("SCALING_MALLOC_TUNING", "1") == "0":
        return False
    platforms = os.environ.get("JAX_PLATFORMS", "")
    accelerator = any(importlib.util.find_spec(name) is not None
                      for name in ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin"))
    if platforms and platforms.split(",")[0] != "cpu":
        return False
    if accelerator and not platforms:
        return False
    return reuse_freed_memory()
