"""Tokens per second the data pipeline delivers on the built-in corpus.

Runs ``Pipeline.train_iterator`` (background prefetch) for a few batch shapes
and reports input tokens (batch x seq_len) per second of wall time, plus the
one-off build time. The pipeline must stay far ahead of training (at least
20x the training tokens/s of an L=4, d=256 model).

    python benchmarks/data_throughput.py            # a table
    python benchmarks/data_throughput.py --json     # one JSON object

In the same run it times the trainer's real train step (``scaling.model.program.build``)
for an L=4, d=256 model on batches of 16 x 128 from the same pipeline, and
prints the ratio of pipeline tokens/s to training tokens/s.

Cache reads: it also builds a token cache of the built-in corpus in a
temporary directory (or uses ``--cache-dir``, e.g. a ``gs://`` cache built
with ``python -m scaling.data cache``) and times what one process of
``--processes`` reads from it with ``data.cache_dir`` set: its rows of each
batch, fetched as byte ranges. It reports tokens/s per process and the bytes
fetched per token, beside the train step's tokens/s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from scaling.config import DataConfig
from scaling.data import pipeline as data, token_cache


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


def cache_config(cache_dir: str, seq_len: int) -> DataConfig:
    """The data config that reads the cache in ``cache_dir`` (its source fields come from its metadata)."""
    source = token_cache.open_cache(cache_dir).metadata["source"]
    fields = {name: tuple(value) if isinstance(value, list) else value for name, value in source.items()}
    return DataConfig(**fields, seq_len=seq_len, cache_dir=cache_dir)


def measure_cache(batch_size: int, seq_len: int, batches: int, processes: int, cache_dir: str) -> dict:
    """Time ``batches`` batches of process 0 of ``processes`` read from the token
    cache in ``cache_dir``: tokens/s of that process's rows, and bytes fetched per token."""
    pipeline = data.build(cache_config(cache_dir, seq_len))
    iterator = pipeline.train_iterator(seed=0, start_step=0, batch_size=batch_size, process_index=0,
                                       process_count=processes)
    for _ in range(3):  # thread start-up and the first epoch permutation
        next(iterator)
    read_before, start = pipeline.train_tokens.bytes_read, time.perf_counter()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - start
    iterator.close()
    tokens = batches * (batch_size // processes) * seq_len
    return {"batch_size": batch_size, "seq_len": seq_len, "processes": processes, "batches": batches,
            "tokens_per_second_per_process": round(tokens / seconds),
            "bytes_fetched_per_token": round((pipeline.train_tokens.bytes_read - read_before) / tokens, 3)}


def training_tokens_per_second(depth: int = 4, width: int = 256, batch_size: int = 16, seq_len: int = 128,
                               steps: int = 20) -> float:
    """Tokens/s of the trainer's jitted train step for one (depth, width), after compilation."""
    import jax

    from scaling.model import mesh as mesh_lib, program as program_lib
    from scaling.config import MeshConfig, ModelConfig, TrainConfig

    pipeline = data.build(DataConfig(seq_len=seq_len))
    config = TrainConfig(model=ModelConfig(depth=depth, width=width, vocab_size=pipeline.vocab_size,
                                           max_seq_len=seq_len), data=DataConfig(seq_len=seq_len),
                         batch_size=batch_size, steps=steps + 2)
    mesh = mesh_lib.make_mesh(MeshConfig(), jax.devices()[:1])
    program = program_lib.build(config, mesh)
    state = program.init(jax.random.PRNGKey(0))
    hparams = jax.device_put(program_lib.hyperparameters(config), mesh_lib.replicated(mesh))
    batches = [mesh_lib.global_batch(pipeline.train_batch(0, step, batch_size), mesh, batch_size)
               for step in range(steps + 2)]
    for batch in batches[:2]:  # compile and warm up
        state, metrics = program.train_step(state, batch, hparams)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for batch in batches[2:]:
        state, metrics = program.train_step(state, batch, hparams)
    jax.block_until_ready(metrics)
    return steps * batch_size * seq_len / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["16x128", "256x512"],
                        help="BATCHxSEQ_LEN shapes to time (sequences x tokens)")
    parser.add_argument("--batches", type=int, default=300, help="batches timed per shape")
    parser.add_argument("--tokenizer", default="byte", help="byte, bpe or hf:PATH")
    parser.add_argument("--processes", type=int, default=4,
                        help="cache reads: time process 0 of this many (each reads batch/processes rows)")
    parser.add_argument("--cache-dir", help="cache reads: an existing token cache (local or gs://); "
                                            "default: the built-in corpus cached in a temporary directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    try:
        shapes = [tuple(int(part) for part in shape.split("x")) for shape in args.shapes]
    except ValueError:
        parser.error(f"--shapes {args.shapes}: each must look like 16x128")
    if any(batch % args.processes for batch, _ in shapes + [(16, 128)]):
        parser.error(f"--processes {args.processes} must divide every batch size (and 16)")
    results = [measure(b, t, args.batches, args.tokenizer) for b, t in shapes]
    with tempfile.TemporaryDirectory() as scratch:
        cache_dir = args.cache_dir or str(token_cache.build_cache(DataConfig(tokenizer=args.tokenizer), scratch))
        cached = [measure_cache(b, t, args.batches, args.processes, cache_dir) for b, t in shapes + [(16, 128)]]
    training = training_tokens_per_second()
    pipeline_16x128 = measure(16, 128, args.batches, args.tokenizer)["tokens_per_second"]
    cache_16x128 = cached.pop()["tokens_per_second_per_process"]
    comparison = {"training_tokens_per_second_L4_d256": round(training),
                  "pipeline_tokens_per_second_16x128": pipeline_16x128,
                  "pipeline_over_training": round(pipeline_16x128 / training, 1),
                  "cache_tokens_per_second_per_process_16x128": cache_16x128,
                  "cache_over_training": round(cache_16x128 * args.processes / training, 1)}
    if args.json:
        print(json.dumps({"data_throughput": results, "cache_reads": cached, **comparison}))
        return
    print(f"{'batch':>6} {'seq_len':>8} {'build s':>8} {'tokens/s':>14}")
    for r in results:
        print(f"{r['batch_size']:>6} {r['seq_len']:>8} {r['build_seconds']:>8.2f} {r['tokens_per_second']:>14,}")
    where = f"--cache-dir {args.cache_dir}" if args.cache_dir else "built-in corpus"
    print(f"\ncache reads, process 0 of {args.processes} ({where}):")
    print(f"{'batch':>6} {'seq_len':>8} {'tokens/s/process':>17} {'bytes/token':>12}")
    for r in cached:
        print(f"{r['batch_size']:>6} {r['seq_len']:>8} {r['tokens_per_second_per_process']:>17,} "
              f"{r['bytes_fetched_per_token']:>12}")
    print(f"training step, L=4 d=256, batch 16 x 128: {comparison['training_tokens_per_second_L4_d256']:,} tokens/s; "
          f"pipeline / training = {comparison['pipeline_over_training']:,}x; cache reads of "
          f"{args.processes} processes / training = {comparison['cache_over_training']:,}x")


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    main()
