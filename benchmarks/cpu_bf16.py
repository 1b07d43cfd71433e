"""Does bfloat16 compute pay on this CPU? XLA:CPU's bf16 products, and the train step at compute_dtype=bfloat16.

Three measurements, each printed with the CPU (``cpu_info.py``):

1. whether XLA:CPU keeps a bf16 matrix product in bf16: the compiled HLO of a
   ``[2048, 256] @ [256, 1024]`` bf16 product is searched for a dot (or a
   library fusion holding one) whose operands are bf16. Where it is not,
   XLA converts both operands to float32 first, and bf16 can only cost;
2. the speed of that product, float32 against bf16, jitted JAX and
   ``torch.mm`` (2 threads), best of several: what the CPU's bf16 units
   (AVX-512-BF16, AMX) give each framework;
3. the benchmark's train step (``throughput.Ours``) built with
   ``ModelConfig.compute_dtype`` float32 and bfloat16 from the same
   initialisation: the largest loss difference over ``--steps`` steps on
   one fixed batch, and the step times, alternating, medians.

    python benchmarks/cpu_bf16.py --configs 4x128 4x256
"""

from __future__ import annotations

import statistics
import sys
import time

import cpu_info
import throughput  # first: it configures JAX and the allocator as the benchmark does

from scaling import cli
from sweeps.preflight import hlo


def xla_keeps_bf16_products() -> bool:
    """True when XLA:CPU compiles a bf16 ``[2048, 256] @ [256, 1024]`` into dots of bf16 operands."""
    import jax
    import jax.numpy as jnp

    left, right = jnp.ones((2048, 256), jnp.bfloat16), jnp.ones((256, 1024), jnp.bfloat16)
    return dots_multiply_bf16(jax.jit(lambda a, b: a @ b).lower(left, right).compile().as_text())


def dots_multiply_bf16(hlo_text: str) -> bool:
    """True when every dot in optimized HLO text (fused or not) has bf16 operands; False when there is none."""
    module = hlo.parse(hlo_text)
    operand_types = [computation.by_name[operand].type_text for computation in module.computations.values()
                     for instruction in computation.instructions if instruction.opcode == "dot"
                     for operand in instruction.operands if operand in computation.by_name]
    return bool(operand_types) and all(text.startswith("bf16") for text in operand_types)


def product_rates() -> dict[str, float]:
    """GFLOP/s of a [2048, 256] @ [256, 1024] product in float32 and bfloat16, JAX and torch."""
    import jax
    import jax.numpy as jnp
    import torch

    torch.set_num_threads(throughput.THREADS)
    flops, rates = 2 * 2048 * 256 * 1024, {}

    def best(function) -> float:
        function()
        times = []
        for _ in range(10):
            start = time.perf_counter()
            function()
            times.append(time.perf_counter() - start)
        return flops / min(times) / 1e9

    for name in ("float32", "bfloat16"):
        dtype, torch_dtype = jnp.dtype(name), getattr(torch, name)
        a, b = jnp.ones((2048, 256), dtype), jnp.ones((256, 1024), dtype)
        product = jax.jit(lambda x, y: x @ y)
        rates[f"jax {name}"] = best(lambda: product(a, b).block_until_ready())
        ta, tb = torch.ones((2048, 256), dtype=torch_dtype), torch.ones((256, 1024), dtype=torch_dtype)
        rates[f"torch {name}"] = best(lambda: torch.mm(ta, tb))
    return rates


def step_comparison(depth: int, width: int, steps: int, rounds: int) -> dict:
    """Largest |loss(bf16) - loss(float32)| over ``steps`` steps, and each dtype's median step time in ms."""
    import numpy as np

    runs = {dtype: throughput.Ours(depth, width, scan_layers=False, compute_dtype=dtype)
            for dtype in ("float32", "bfloat16")}
    losses = {}
    for dtype, run in runs.items():
        values = []
        for _ in range(steps):
            run.state, metrics = run.step(run.state, run.batch, run.hparams)
            values.append(float(metrics["loss"]))
        losses[dtype] = np.array(values)
    difference = np.abs(losses["bfloat16"] - losses["float32"])
    per_round = max(2, throughput.steps_per_repeat(depth, width, 0.5))
    times = {dtype: [] for dtype in runs}
    for _ in range(rounds):
        for dtype, run in runs.items():
            times[dtype].append(1e3 * run.run(per_round) / per_round)
    return {"config": f"{depth}x{width}", "max_loss_difference": float(difference.max()),
            "max_loss_difference_first_10": float(difference[:10].max()),
            "final_losses": {dtype: float(values[-1]) for dtype, values in losses.items()},
            "ms": {dtype: statistics.median(values) for dtype, values in times.items()}}


def main() -> None:
    parser = cli.doc_parser(__doc__)
    parser.add_argument("--configs", nargs="+", default=["4x256"], metavar="LxD", help="depth x width pairs")
    parser.add_argument("--steps", type=int, default=50, help="steps whose losses are compared (default: 50)")
    parser.add_argument("--rounds", type=int, default=6, help="alternating timing rounds (default: 6)")
    args = parser.parse_args()
    try:
        configs = [throughput.parse_config(text) for text in args.configs]
        if args.steps < 1 or args.rounds < 1:
            raise ValueError("--steps and --rounds must be >= 1")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"CPU: {cpu_info.describe()['summary']}")
    print(f"XLA:CPU multiplies bf16 operands in bf16: {'yes' if xla_keeps_bf16_products() else 'no (converts to f32)'}")
    for name, rate in product_rates().items():
        print(f"  [2048,256]@[256,1024] {name:<15} {rate:7.0f} GFLOP/s")
    for depth, width in configs:
        row = step_comparison(depth, width, args.steps, args.rounds)
        print(f"{row['config']}: step float32 {row['ms']['float32']:.1f} ms, bfloat16 {row['ms']['bfloat16']:.1f} ms "
              f"(bf16 speed-up {row['ms']['float32'] / row['ms']['bfloat16']:.2f}x); |loss difference| "
              f"<= {row['max_loss_difference_first_10']:.2e} over the first 10 steps, "
              f"<= {row['max_loss_difference']:.2e} over {args.steps}; final losses {row['final_losses']}")


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()
    main()
