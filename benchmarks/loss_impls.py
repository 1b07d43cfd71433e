"""CPU: the chunked and the fused loss (``model.loss_impl``) side by side: train-step tokens/s and peak memory.

    python benchmarks/loss_impls.py                      # 4x256 and 2x64, 5 interleaved repeats
    python benchmarks/loss_impls.py --repeats 3 --json

Throughput: ``benchmarks/throughput.py``'s harness (the trainer's jitted
train step on one CPU device: random byte tokens, 16 sequences of 128,
float32, scanned layers), one runner per loss implementation, timed in
alternation so both see the same machine state; medians, and the CPU cores
other processes used meanwhile (only rows near 0 are fair).

Memory: XLA's ``memory_analysis()`` of the compiled train step (temporary
buffers: the step's peak beyond its arguments and outputs) with GPT-2's BPE
vocabulary as the paper sweep has it (50,261 ids, padded to 50,304), at
the tiny preset's shape (depth 2, width 64) and at 4x256, both 16 sequences
of 128 tokens: compiled, nothing allocated.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time

import throughput  # first: it configures JAX and the allocator for this CPU benchmark

from scaling import cli
from scaling.model.flops import training_flops_per_token

IMPLS = ("chunked", "fused")
SHAPES = ("4x256", "2x64")  # 2x64: the tiny preset's depth and width (python -m scaling.train --config tiny)
BPE_VOCAB = 50261  # GPT-2's 50,257 ids and the paper sweep's 4 special ids


def tokens_per_second(depth: int, width: int, repeats: int, vocab_size: int = throughput.VOCAB) -> dict:
    """Median tokens/s of each impl's train step, timed in alternation, and other processes' CPU use."""
    runners = {impl: throughput.Ours(depth, width, loss_impl=impl, vocab_size=vocab_size) for impl in IMPLS}
    step_flops = training_flops_per_token(runners["chunked"].config.model, throughput.SEQ_LEN).total
    steps = max(3, round(1.2e11 / (step_flops * throughput.BATCH * throughput.SEQ_LEN)))  # about a second
    rates = {impl: [] for impl in IMPLS}
    start_wall, start_machine = time.perf_counter(), throughput.machine_busy_seconds()
    start_own = throughput.own_busy_seconds()
    for _ in range(repeats):
        for impl, runner in runners.items():
            rates[impl].append(steps * throughput.BATCH * throughput.SEQ_LEN / runner.run(steps))
    others = ((throughput.machine_busy_seconds() - start_machine) - (throughput.own_busy_seconds() - start_own)) / (
        time.perf_counter() - start_wall)
    medians = {impl: statistics.median(values) for impl, values in rates.items()}
    return {"shape": f"{depth}x{width}, vocab {vocab_size}", "tokens_per_second": medians, "all": rates,
            "fused_over_chunked": medians["fused"] / medians["chunked"], "other_processes_cores": max(others, 0.0)}


def peak_memory(depth: int, width: int, batch: int, seq_len: int) -> dict:
    """Compiled temporary bytes of the train step per impl, with the 50k BPE vocabulary."""
    import jax

    from scaling.config import DataConfig, MeshConfig
    from scaling.model import mesh as mesh_lib, run_program

    mesh = mesh_lib.make_mesh(MeshConfig(), jax.devices()[:1])
    found = {}
    for impl in IMPLS:
        config = throughput.train_config(depth, width, vocab_size=BPE_VOCAB, max_seq_len=seq_len, loss_impl=impl)
        config = dataclasses.replace(config, batch_size=batch, data=DataConfig(seq_len=seq_len))
        found[impl] = run_program.lower_train_step(config, mesh)[1].compile().memory_analysis().temp_size_in_bytes
    return {"shape": f"{depth}x{width}, {batch}x{seq_len} tokens, vocab {BPE_VOCAB}", "temp_bytes": found}


def main(argv=None) -> int:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions per shape (median)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        print(f"error: --repeats {args.repeats}: must be >= 1", file=sys.stderr)
        return 2
    speed = [tokens_per_second(*throughput.parse_config(shape), args.repeats) for shape in SHAPES]
    speed.append(tokens_per_second(2, 64, args.repeats, BPE_VOCAB))  # the tiny shape with the 50k vocabulary
    memory = [peak_memory(2, 64, 16, 128), peak_memory(4, 256, 16, 128)]
    if args.json:
        print(json.dumps({"speed": speed, "memory": memory, "cpu": throughput.cpu_info.describe()}))
        return 0
    print(f"CPU: {throughput.cpu_info.describe()['summary']}")
    print("| shape | chunked tok/s | fused tok/s | fused / chunked | other processes' cores |")
    print("|---|---:|---:|---:|---:|")
    for row in speed:
        rates = row["tokens_per_second"]
        print(f"| {row['shape']} | {rates['chunked']:,.0f} | {rates['fused']:,.0f} | {row['fused_over_chunked']:.3f} "
              f"| {row['other_processes_cores']:.2f} |")
    print("\n| train step (compiled) | chunked temp MiB | fused temp MiB |\n|---|---:|---:|")
    for row in memory:
        temp = row["temp_bytes"]
        print(f"| {row['shape']} | {temp['chunked'] / 2**20:,.1f} | {temp['fused'] / 2**20:,.1f} |")
    return 0


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    sys.exit(main())
