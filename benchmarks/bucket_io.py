"""Requests and bytes a training run sends to a bucket (issue 26), and what a slow bucket costs it (issue 41).

    python benchmarks/bucket_io.py [--steps 50] [--metrics-steps 1000] [--delay-ms 200] [--only slow-bucket]

Starts fake-gcs-server (the dev extra's bundled binary, as the tests do) with
a counting HTTP proxy in front of it (tests/gcs_emulator.py), points every
client at the proxy through ``STORAGE_EMULATOR_HOST``, and counts what
reaches it:

1. **Token cache reads.** The built-in corpus is cached in the bucket, then
   one process of a two-process job (``process_index=0, process_count=2``)
   draws ``--steps`` training batches of 16 rows × 64 tokens. *Before*: the
   range-read scheme, one HTTP range request per window (what ``open_cache``
   did at the parent commit; it is still there as ``local_copy=False``, the
   same code). *After*: the default, each shard copied to the local disk the
   first time a window needs it. Printed: object GET requests per step per
   process (mean over the steps, and in the first step).
2. **Metrics bytes.** A tracker logs ``--metrics-steps`` steps with
   ``log_every=1`` (a loss, a gradient norm, a learning rate, tokens per
   second, MFU and tokens per row, as the trainer logs them) into a gs://
   run directory. *Before*: ``scaling/run/track.py`` of the parent commit
   (read with ``git show``, run unchanged), which rewrites the whole
   ``metrics.jsonl`` at every flush. *After*: the current tracker (one new
   object per flush). Printed: bytes of upload bodies and upload requests.
3. **A slow bucket** (issue 41, item 13). A micro run (depth 1, width 32, 200
   steps, log every 10, evaluation and checkpoint every 50) trains into a
   gs:// run directory in this process, first through the proxy as it is,
   then with ``--delay-ms`` added to every request (a slow or distant
   bucket), then as it is again (the first run compiles). Printed per run:
   the training loop's seconds per step (from the first step's return, after
   compilation, to the loop's end: steps, metrics, evaluations, checkpoints
   and lease checks), the run's wall seconds, and requests sent. Periodic
   checkpoints are saved behind the loop (``scaling/store/background_save.py``: the
   metrics wait, the lease read and the orbax write on one thread, the newest
   checkpoint only), so the loop pays for a host copy of the state per
   checkpoint; the run's wall seconds also hold the end's durable writes
   (the checkpoint under way, the final checkpoint, the record).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
PARENT_COMMIT = "49f8e69"  # the commit issue 26's branch started from


def token_requests(proxy, bucket: str, steps: int, local_copy: bool, copies: Path) -> tuple[float, int]:
    """(mean object GETs per step, GETs in the first step) for process 0 of 2 drawing ``steps`` batches."""
    from scaling.data import pipeline as data, token_cache
    from scaling.config import DataConfig

    config = DataConfig(source="builtin", seq_len=64, cache_dir=f"{bucket}/tokens")
    os.environ["XDG_CACHE_HOME"] = str(copies)  # a fresh, empty place for the local copies
    cache = token_cache.open_cache(config.cache_dir, config, local_copy=local_copy)
    pipeline = data.build(config)
    pipeline.train_tokens, pipeline.validation_tokens = cache.train, cache.validation  # the mode asked for

    def gets() -> int:
        return sum(1 for method, path in proxy.requests if method == "GET" and "alt=media" in path
                   and "train-" in path)

    counts, before = [], gets()
    for step in range(steps):
        pipeline.train_batch(0, step, 16, process_index=0, process_count=2)
        now = gets()
        counts.append(now - before)
        before = now
    return sum(counts) / steps, counts[0]


def metrics_upload(proxy, run_dir: str, steps: int, tracker_class) -> tuple[int, int]:
    """(bytes of upload bodies, upload requests) for ``steps`` steps logged at every step."""
    start = len(proxy.uploads)
    tracker = tracker_class(run_dir, total_steps=steps, start_step=0, config={}, name="bench", mode="disabled",
                            show_progress=False)
    for step in range(1, steps + 1):
        tracker.log(step, {"loss": 3.0 / step ** 0.1, "grad_norm": 0.5, "lr": 3e-3, "tokens_per_second": 12345.6,
                           "mfu": 0.123, "tokens": step * 1024})
    tracker.close()
    uploads = proxy.uploads[start:]
    return sum(size for _, size in uploads), len(uploads)


def parent_tracker_class():
    """``Tracker`` from the parent commit's scaling/run/track.py, run as it was."""
    source = subprocess.run(["git", "show", f"{PARENT_COMMIT}:scaling/run/track.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("track_before")
    module.__file__ = "track_before.py"
    exec(compile(source, f"{PARENT_COMMIT}:scaling/run/track.py", "exec"), module.__dict__)
    return module.Tracker


def slow_bucket_run(proxy, run_dir: str, delay_s: float) -> dict:
    """Train the micro run into ``run_dir`` with ``delay_s`` added per request: loop seconds per step, wall
    seconds of the run, requests."""
    import dataclasses

    from scaling.run import train
    from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
    from scaling.run.track import Tracker

    config = TrainConfig(model=ModelConfig(depth=1, width=32, head_dim=16, max_seq_len=32),
                         data=DataConfig(source="builtin", seq_len=32), optim=OptimConfig(peak_lr=3e-3, warmup_steps=2),
                         steps=200, batch_size=8, eval_every=50, eval_batches=1, checkpoint_every=50, log_every=10,
                         keep_checkpoints=3, wandb_mode="disabled", name="slow-bucket")
    config = dataclasses.replace(config, eval_at_start=False)
    times = {}
    advance, end_steps = Tracker.advance, train.Training.end_steps

    def first_advance(self, steps=1):
        times.setdefault("first_step", time.perf_counter())
        return advance(self, steps)

    def timed_end_of_steps(self):  # the training clock stops: after the last step's metrics were fetched
        times.setdefault("loop_end", time.perf_counter())
        return end_steps(self)

    Tracker.advance, train.Training.end_steps = first_advance, timed_end_of_steps
    proxy.delay, requests = delay_s, len(proxy.requests)
    try:
        record = train.run(config, run_dir, show_progress=False)
    finally:
        Tracker.advance, train.Training.end_steps, proxy.delay = advance, end_steps, 0.0
    return {"step_s": (times["loop_end"] - times["first_step"]) / (config.steps - 1), "wall_s": record.wall_seconds,
            "requests": len(proxy.requests) - requests}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="training batches drawn from the token cache")
    parser.add_argument("--metrics-steps", type=int, default=1000, help="steps logged, log_every=1")
    parser.add_argument("--delay-ms", type=float, default=200.0, help="milliseconds added to each storage request "
                                                                       "in the slow-bucket runs")
    parser.add_argument("--only", choices=["slow-bucket"], help="run only this part")
    args = parser.parse_args(argv)

    from gcs_emulator import Emulator, FaultProxy

    with tempfile.TemporaryDirectory(prefix="bucket-io-") as folder:
        folder = Path(folder)
        server = Emulator(folder / "objects", folder / "server.log")
        server.start()
        proxy = FaultProxy(server.url)
        try:
            os.environ["STORAGE_EMULATOR_HOST"] = proxy.url
            os.environ["JAX_PLATFORMS"] = "cpu"
            from scaling.store import storage

            storage.use_emulator()
            server.create_bucket("bench")
            bucket = "gs://bench"
            if args.only == "slow-bucket":
                print_slow_bucket(proxy, bucket, args.delay_ms)
                return 0
            from scaling.data import token_cache
            from scaling.config import DataConfig

            token_cache.build_cache(DataConfig(source="builtin", seq_len=64), f"{bucket}/tokens",
                                    documents_per_shard=200)
            metadata = json.loads((token_cache.epath.Path(f"{bucket}/tokens") / "metadata.json").read_text())
            shards = len(metadata["shards"]["train"])
            before = token_requests(proxy, bucket, args.steps, False, folder / "copies-before")
            after = token_requests(proxy, bucket, args.steps, True, folder / "copies-after")
            print(f"token cache (builtin corpus, {shards} train shards; 16 rows x 64 tokens per step, "
                  f"process 0 of 2, {args.steps} steps):")
            print(f"  before (one range request per window): {before[0]:.2f} requests/step/process "
                  f"(first step {before[1]})")
            print(f"  after (local copy per shard):          {after[0]:.2f} requests/step/process "
                  f"(first step {after[1]})")

            started = time.time()
            old_bytes, old_requests = metrics_upload(proxy, f"{bucket}/before", args.metrics_steps,
                                                     parent_tracker_class())
            from scaling.run.track import Tracker

            new_bytes, new_requests = metrics_upload(proxy, f"{bucket}/after", args.metrics_steps, Tracker)
            print(f"metrics, {args.metrics_steps} steps, log_every=1 ({time.time() - started:.0f} s):")
            print(f"  before (whole metrics.jsonl rewritten per flush): {old_bytes:,} bytes in "
                  f"{old_requests} uploads")
            print(f"  after (one new object per flush):                 {new_bytes:,} bytes in "
                  f"{new_requests} uploads")
            print_slow_bucket(proxy, bucket, args.delay_ms)
        finally:
            proxy.close()
            server.stop()
    return 0


def print_slow_bucket(proxy, bucket: str, delay_ms: float) -> None:
    """Part 3: the micro run without, with, and again without the delay."""
    runs = [("as it is (compiles)", 0.0), (f"+{delay_ms:g} ms per request", delay_ms / 1000), ("as it is", 0.0)]
    results = [(label, slow_bucket_run(proxy, f"{bucket}/slow-{i}", delay)) for i, (label, delay) in enumerate(runs)]
    print("slow bucket (depth 1, width 32, 200 steps, log every 10, eval + checkpoint every 50, gs://):")
    for label, result in results:
        print(f"  {label:<28} {1000 * result['step_s']:7.1f} ms/step in the loop, run {result['wall_s']:5.1f} s, "
              f"{result['requests']} requests")
    print(f"  loop time with the delay / without: {results[1][1]['step_s'] / results[2][1]['step_s']:.2f}x")


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    sys.exit(main())
