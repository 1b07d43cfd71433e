"""Tokens per second the data pipeline delivers on the built-in corpus.

Runs ``Pipeline.train_iterator`` (background prefetch) for a few batch shapes
and reports input tokens (batch x seq_len) per second of wall time, plus the
one-off build time. The pipeline must stay far ahead of training (issue 3
asks for 20x the training tokens/s of an L=4, d=256 model).

    python benchmarks/data_throughput.py            # a table
    python benchmarks/data_throughput.py --json     # one JSON object
"""

from __future__ import annotations

import argparse
import json
import time

from scaling import data
from scaling.config import DataConfig


def measure(batch_size: int, seq_len: int, batches: int, tokenizer: str) -> dict:
    """Build the builtin pipeline for ``seq_len`` tokens and time ``batches``
    batches of ``batch_size`` sequences from its prefetching iterator."""
    start = time.perf_counter()
    pipeline = data.build(DataConfig(seq_len=seq_len, tokenizer=tokenizer))
    build_seconds = time.perf_counter() - start
    iterator = pipeline.train_iterator(seed=0, start_step=0, batch_size=batch_size)
    for _ in range(3):  # thread start-up and the first epoch permutation
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - start
    iterator.close()
    return {"batch_size": batch_size, "seq_len": seq_len, "tokenizer": tokenizer, "batches": batches,
            "build_seconds": round(build_seconds, 3),
            "tokens_per_second": round(batches * batch_size * seq_len / seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["16x128", "256x512"],
                        help="BATCHxSEQ_LEN shapes to time (sequences x tokens)")
    parser.add_argument("--batches", type=int, default=300, help="batches timed per shape")
    parser.add_argument("--tokenizer", default="byte", help="byte, bpe or hf:PATH")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    try:
        shapes = [tuple(int(part) for part in shape.split("x")) for shape in args.shapes]
    except ValueError:
        parser.error(f"--shapes {args.shapes}: each must look like 16x128")
    results = [measure(b, t, args.batches, args.tokenizer) for b, t in shapes]
    if args.json:
        print(json.dumps({"data_throughput": results}))
        return
    print(f"{'batch':>6} {'seq_len':>8} {'build s':>8} {'tokens/s':>14}")
    for r in results:
        print(f"{r['batch_size']:>6} {r['seq_len']:>8} {r['build_seconds']:>8.2f} {r['tokens_per_second']:>14,}")


if __name__ == "__main__":
    main()
