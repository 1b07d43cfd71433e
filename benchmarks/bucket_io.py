"""Requests and bytes a training run sends to a bucket: before and after issue 26's changes.

    python benchmarks/bucket_io.py [--steps 50] [--metrics-steps 1000]

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
   run directory. *Before*: ``scaling/track.py`` of the parent commit
   (read with ``git show``, run unchanged), which rewrites the whole
   ``metrics.jsonl`` at every flush. *After*: the current tracker (one new
   object per flush). Printed: bytes of upload bodies and upload requests.
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
    from scaling import data, token_cache
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
    """``Tracker`` from the parent commit's scaling/track.py, run as it was."""
    source = subprocess.run(["git", "show", f"{PARENT_COMMIT}:scaling/track.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("track_before")
    module.__file__ = "track_before.py"
    exec(compile(source, f"{PARENT_COMMIT}:scaling/track.py", "exec"), module.__dict__)
    return module.Tracker


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="training batches drawn from the token cache")
    parser.add_argument("--metrics-steps", type=int, default=1000, help="steps logged, log_every=1")
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
            from scaling import storage

            storage.use_emulator()
            server.create_bucket("bench")
            bucket = "gs://bench"
            from scaling import token_cache
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
            from scaling.track import Tracker

            new_bytes, new_requests = metrics_upload(proxy, f"{bucket}/after", args.metrics_steps, Tracker)
            print(f"metrics, {args.metrics_steps} steps, log_every=1 ({time.time() - started:.0f} s):")
            print(f"  before (whole metrics.jsonl rewritten per flush): {old_bytes:,} bytes in "
                  f"{old_requests} uploads")
            print(f"  after (one new object per flush):                 {new_bytes:,} bytes in "
                  f"{new_requests} uploads")
        finally:
            proxy.close()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
