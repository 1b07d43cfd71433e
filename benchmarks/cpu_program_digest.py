"""A digest of the CPU train step's lowered program per shape: equal digests from two checkouts mean the
same program, so the same speed, without timing anything.

    python benchmarks/cpu_program_digest.py                              # this checkout
    cd OTHER_CHECKOUT && PYTHONPATH=. python /path/to/benchmarks/cpu_program_digest.py

For each shape (depth × width, the throughput benchmark's 2x64 and 4x256, sequence 128, batch 16, the
default config otherwise) the train step is lowered for one CPU device (``run_program.lower_train_step``)
and its StableHLO text hashed with the source locations removed (they name the checkout's files). Prints
``SHAPE SHA256[:16] CHARACTERS`` per line.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys

SHAPES = ("2x64", "4x256")


def digest(shape: str) -> tuple[str, int]:
    """(the first 16 hex digits of the SHA-256 of the lowered step without locations, its length)."""
    import jax

    from scaling.config import DataConfig, ModelConfig, TrainConfig
    from scaling.model import mesh as mesh_lib, run_program

    depth, width = (int(part) for part in shape.split("x"))
    config = TrainConfig(model=ModelConfig(depth=depth, width=width, max_seq_len=128), data=DataConfig(seq_len=128),
                         batch_size=16)
    mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:1])
    text = run_program.lower_train_step(config, mesh)[1].as_text()
    text = re.sub(r"#loc\d* = .*", "", re.sub(r"loc\([^)]*\)", "", text))
    return hashlib.sha256(text.encode()).hexdigest()[:16], len(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="DEPTHxWIDTH (default 2x64 4x256)")
    args = parser.parse_args(argv)
    for shape in args.shapes:
        if not re.fullmatch(r"\d+x\d+", shape):
            print(f"error: --shapes {shape!r}: allowed DEPTHxWIDTH, e.g. 4x256", file=sys.stderr)
            return 2
        sha, length = digest(shape)
        print(f"{shape} {sha} {length}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.exit(main())
