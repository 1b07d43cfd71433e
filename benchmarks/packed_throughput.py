"""Packed runs on CPU: tokens/s of k runs of one shape one after another, against one packed program.

For each width d and pack size k, k runs of an L-layer model (16-channel heads, batch 16 × 128
random byte tokens, AdamW with clipping; seeds 0..k-1 and k different peak rates) train three ways:
- ``sequential``: the solo step (``scaling.model.program.build(...).train_step``) of each run in turn,
  as a sweep trains them today;
- ``vmap``: the packed step of ``scaling.model.packed`` with ``batching="vmap"`` (the step vmapped over
  the k stacked runs);
- ``map``: the packed step with ``batching="map"`` (``jax.lax.map`` over the runs inside the one step).
All on one CPU device (XLA's threads use every core). The three ways alternate within every
repetition, so each sees the same machine state; the table gives medians over the repetitions
of tokens/s (k · batch · sequence tokens per packed step) and the packed ways' ratio to
``sequential``. The load average is printed: on a shared machine only compare rows of one run.

    python benchmarks/packed_throughput.py                           # d = 64, 128, 256; k = 1, 2, 4, 6
    python benchmarks/packed_throughput.py --widths 64 --packs 6 --json
    python benchmarks/packed_throughput.py --parts --widths 64 --packs 6  # where vmap loses: step parts

``--parts`` times the step's parts alone (the forward pass, forward + backward, the optimizer's
update) for one run k times, vmapped over k runs, and under ``jax.lax.map``: ms per k runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX is imported; skips probing for a TPU
from scaling.cpu_allocator import tune_cpu_allocator  # noqa: E402

tune_cpu_allocator()  # as the command lines do, before JAX starts its threads

SEQ_LEN, BATCH, HEAD_DIM = 128, 16, 16
WAYS = ("sequential", "vmap", "map")


def train_config(depth: int, width: int, seed: int, peak_lr: float):
    from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig

    return TrainConfig(model=ModelConfig(depth=depth, width=width, head_dim=HEAD_DIM, max_seq_len=SEQ_LEN),
                       data=DataConfig(source="builtin", seq_len=SEQ_LEN), optim=OptimConfig(peak_lr=peak_lr),
                       seed=seed, batch_size=BATCH, steps=10_000, wandb_mode="disabled")


def random_batch(vocab: int, seed: int) -> dict:
    import numpy as np

    tokens = np.random.default_rng(seed).integers(0, vocab, (BATCH, SEQ_LEN + 1), dtype=np.int32)
    ones = np.ones((BATCH, SEQ_LEN), np.float32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": ones, "input_mask": ones}


class Trainers:
    """The k runs of one (depth, width) ready to step in each of ``WAYS`` (compiled and warmed up)."""

    def __init__(self, depth: int, width: int, size: int):
        import jax

        from scaling.model import mesh as mesh_lib, packed, program
        from scaling.config import MeshConfig

        device = jax.devices()[:1]
        configs = [train_config(depth, width, seed, 1e-3 * (1 + seed)) for seed in range(size)]
        batches = [random_batch(configs[0].model.vocab_size, seed) for seed in range(size)]
        solo_mesh = mesh_lib.make_mesh(MeshConfig(), device)
        solo = program.build(configs[0], solo_mesh)
        self.solo_step = solo.train_step
        self.solo_states = [solo.init(jax.random.PRNGKey(c.seed)) for c in configs]
        self.solo_batches = [mesh_lib.global_batch(b, solo_mesh, BATCH) for b in batches]
        self.solo_hparams = [jax.device_put(program.hyperparameters(c)) for c in configs]
        packed_mesh = mesh_lib.make_packed_mesh(MeshConfig(), 1, device)
        shape = packed.pack_shape(configs)
        self.packs, self.states = {}, {}
        hparams = packed.stack_hyperparameters([program.hyperparameters(c) for c in configs])
        for batching in packed.BATCHINGS:
            pack = packed.build_packed(shape, packed_mesh, size, batching)
            self.packs[batching] = (pack, packed.global_batch(batches, pack, BATCH), jax.device_put(hparams))
            self.states[batching] = pack.init(packed.stack_keys([c.seed for c in configs]))
        self.size = size
        for way in WAYS:
            self.run(way, 2)  # compile and warm up

    def run(self, way: str, steps: int) -> float:
        """Seconds for ``steps`` steps of all k runs, waiting for the last to finish."""
        import jax

        start = time.perf_counter()
        if way == "sequential":
            for _ in range(steps):
                for i in range(self.size):
                    self.solo_states[i], metrics = self.solo_step(self.solo_states[i], self.solo_batches[i],
                                                                  self.solo_hparams[i])
            jax.block_until_ready(self.solo_states)
        else:
            pack, batch, hparams = self.packs[way]
            for _ in range(steps):
                self.states[way], metrics = pack.train_step(self.states[way], batch, hparams)
            jax.block_until_ready(self.states[way])
        return time.perf_counter() - start


def measure(depth: int, width: int, size: int, repeats: int, seconds: float) -> dict:
    """Median tokens/s of each way over ``repeats`` interleaved repetitions of about ``seconds`` each."""
    trainers = Trainers(depth, width, size)
    probe = trainers.run("sequential", 1)
    steps = max(1, round(seconds / probe))
    tokens = size * BATCH * SEQ_LEN * steps
    rates = {way: [] for way in WAYS}
    load_before = os.getloadavg()[0]
    for repeat in range(repeats):
        order = WAYS if repeat % 2 == 0 else WAYS[::-1]  # neither way always runs first
        for way in order:
            rates[way].append(tokens / trainers.run(way, steps))
    row = {"depth": depth, "width": width, "runs": size, "steps": steps, "repeats": repeats,
           "load_average": round((load_before + os.getloadavg()[0]) / 2, 1)}
    for way in WAYS:
        row[f"{way}_tokens_per_second"] = round(statistics.median(rates[way]))
    for way in WAYS[1:]:
        ratios = [packed / alone for packed, alone in zip(rates[way], rates["sequential"])]
        row[f"{way}_ratio"] = round(statistics.median(ratios), 3)
    return row


def measure_parts(depth: int, width: int, size: int, repeats: int) -> list[dict]:
    """Median ms of the step's parts for ``size`` runs: one run's part ``size`` times, vmapped, lax.map'ped."""
    import jax
    import jax.numpy as jnp
    import optax

    from scaling.model import mesh as mesh_lib, optim as optim_lib, program
    from scaling.config import MeshConfig
    from scaling.model.loss import compute_loss, loss_and_grads

    config = train_config(depth, width, 0, 1e-3)
    solo = program.build(config, mesh_lib.make_mesh(MeshConfig(), jax.devices()[:1]))
    batch, hparams = random_batch(config.model.vocab_size, 0), program.hyperparameters(config)
    state = solo.init(jax.random.PRNGKey(0))

    def forward(params, batch, hparams):
        return compute_loss(solo.model, params, batch, rng=hparams["key"], deterministic=True)[0]

    def gradients(params, batch, hparams):
        return loss_and_grads(solo.model, params, batch, rng=hparams["key"], microbatches=1, deterministic=True)[2]

    def update(state, grads, hparams):
        tx = optim_lib.make_optimizer(solo.shape.optim, solo.shape.grouped, hparams)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return optax.apply_updates(state["params"], updates), opt_state

    grads = jax.jit(gradients)(state["params"], batch, hparams)
    stacked = lambda tree: jax.tree_util.tree_map(lambda x: jnp.stack([x] * size), tree)  # noqa: E731

    def median_ms(function, *arguments):
        jax.block_until_ready(function(*arguments))
        times = []
        for _ in range(repeats * 3):
            start = time.perf_counter()
            jax.block_until_ready(function(*arguments))
            times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times)

    rows = []
    for name, part, one in (("forward", forward, (state["params"], batch, hparams)),
                            ("forward+backward", gradients, (state["params"], batch, hparams)),
                            ("optimizer", update, (state, grads, hparams))):
        many = tuple(stacked(argument) for argument in one)
        alone = size * median_ms(jax.jit(part), *one)
        vmapped = median_ms(jax.jit(jax.vmap(part)), *many)
        mapped = median_ms(jax.jit(lambda *a, part=part: jax.lax.map(lambda x: part(*x), a)), *many)
        rows.append({"depth": depth, "width": width, "runs": size, "part": name, "sequential_ms": round(alone, 1),
                     "vmap_ms": round(vmapped, 1), "map_ms": round(mapped, 1),
                     "load_average": round(os.getloadavg()[0], 1)})
    return rows


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Tokens/s of k runs one after another vs. one packed program "
                                                 "(vmap and lax.map over the runs), on one CPU device.")
    parser.add_argument("--depth", type=int, default=2, help="layers (default 2)")
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256], help="model widths d")
    parser.add_argument("--packs", type=int, nargs="+", default=[1, 2, 4, 6], help="runs per pack k")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions per row (default 5)")
    parser.add_argument("--seconds", type=float, default=0.5,
                        help="about how long one way is timed per repetition (default 0.5)")
    parser.add_argument("--parts", action="store_true",
                        help="time the step's parts (forward, forward+backward, optimizer) instead")
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    args = parser.parse_args(argv)
    for name in ("depth", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if min(args.widths) < 1 or min(args.packs) < 1 or args.seconds <= 0:
        parser.error("--widths and --packs must be >= 1 and --seconds > 0")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rows = []
    if args.parts:
        for width in args.widths:
            for size in args.packs:
                rows += measure_parts(args.depth, width, size, args.repeats)
        if args.json:
            print(json.dumps(rows, indent=1))
        for row in [] if args.json else rows:
            print(f"L{row['depth']} d{row['width']} k={row['runs']} {row['part']:>16}: {row['runs']}× alone "
                  f"{row['sequential_ms']:7.1f} ms, vmap {row['vmap_ms']:7.1f} ms, lax.map {row['map_ms']:7.1f} ms "
                  f"(load {row['load_average']})")
        return 0
    if not args.json:
        print(f"{'L':>2} {'d':>4} {'k':>2} {'sequential':>11} {'vmap':>9} {'ratio':>6} {'map':>9} {'ratio':>6} "
              f"{'load':>5}   (tokens/s, medians)")
    for width in args.widths:
        for size in args.packs:
            row = measure(args.depth, width, size, args.repeats, args.seconds)
            rows.append(row)
            if not args.json:
                print(f"{row['depth']:>2} {width:>4} {size:>2} {row['sequential_tokens_per_second']:>11} "
                      f"{row['vmap_tokens_per_second']:>9} {row['vmap_ratio']:>6.2f} "
                      f"{row['map_tokens_per_second']:>9} {row['map_ratio']:>6.2f} {row['load_average']:>5}",
                      flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    sys.exit(main())
