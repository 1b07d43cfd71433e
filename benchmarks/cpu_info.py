"""The CPU a benchmark figure was measured on: its model name and the vector/matrix extensions that set its speed.

Every CPU figure in ``benchmarks/`` carries this beside it, so that figures from
machines of different kinds (with or without AVX-512, AVX-512-BF16 or AMX) are
never put side by side as if they were comparable. Read from Linux's
``/proc/cpuinfo``; elsewhere the model is ``platform.processor()`` and the
flags are unknown (``None``).

    python benchmarks/cpu_info.py        # one line: model, cores, AVX-512 / AVX-512-BF16 / AMX
"""

from __future__ import annotations

import os
import platform

# The extensions that decide float32 and bfloat16 matmul speed on x86: AVX-512
# (16 float32 lanes), AVX-512-BF16 (bf16 dot products in vector registers),
# AVX-512-VNNI, and AMX (Intel's tile matrix units, bf16 and int8).
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


def describe(cpuinfo_path: str = "/proc/cpuinfo") -> dict:
    """``{"model": str, "cores": int, "flags": {name: bool} or None, "summary": str}`` for this machine.

    ``flags`` maps each of ``FLAGS`` to whether the CPU reports it; ``summary``
    is one line for tables, e.g. ``AMD EPYC (2 cores; AVX-512 yes, AVX-512-BF16 yes, AMX no)``.
    """
    model, reported = platform.processor() or platform.machine() or "unknown", None
    try:
        with open(cpuinfo_path) as handle:
            text = handle.read()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key == "flags" and reported is None:
            reported = set(value.split())
    flags = None if reported is None else {name: name in reported for name in FLAGS}
    info = {"model": model, "cores": os.cpu_count() or 0, "flags": flags}
    return {**info, "summary": summary(info)}


def summary(info: dict) -> str:
    """One line naming the model, the cores and the AVX-512 / AVX-512-BF16 / AMX support of ``describe()``'s dict."""
    flags = info["flags"]

    def has(*names: str) -> str:
        return "unknown" if flags is None else "yes" if all(flags[name] for name in names) else "no"

    return (f"{info['model']} ({info['cores']} cores; AVX-512 {has('avx512f')}, "
            f"AVX-512-BF16 {has('avx512_bf16')}, AMX {has('amx_tile', 'amx_bf16')})")


if __name__ == "__main__":
    from scaling import cli

    cli.doc_parser(__doc__).parse_args()
    print(describe()["summary"])
