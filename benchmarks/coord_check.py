"""Coordinate check: every layer's activation and update sizes over the first Adam steps, across widths and depths.

For each parametrization (``standard``, ``mup``, ``completep``, and ``completep-a0.5``: CompleteP's
depth family at α = 0.5, ``optim.depth_alpha``) and each shape, the trainer's own step
(``scaling.model.program.build(config, mesh).train_step``) takes ``--steps`` AdamW steps on the built-in
corpus from the base shape's rate, with weight decay, the parametrization's epsilon rule and gradient
clipping on (the rules of ``sweeps/configs/hp_transfer2.py``). After each step a fixed held-out batch
is run through the model and the root-mean-square (RMS) size of every layer's output is read, with the
RMS of its change since initialisation (Δ, the part training adds):
- ``embedding``: the embedding's output (token and position), the residual stream entering block 0;
- per block: the attention logits q·k (scaled as the model scales them, causal entries only), the
  feed-forward's hidden pre-activation, the attention and feed-forward outputs, the residual stream
  after the block;
- ``final_norm``: the final norm's output; ``logits``;
- each parameter group's update (hidden matrices, the blocks' norms and biases, the rest).

What the parametrizations promise ("Tensor Programs V: Tuning Large Neural Networks via Zero-Shot
Hyperparameter Transfer", section 6 and its coordinate checks; "Don't be lazy: CompleteP enables
compute-efficient deep transformers", section 4 and its depth-wise coordinate check): under the standard
parametrization Δ grows with width (Adam moves every weight by about the rate, and a width-d dot
product sums d such moves) and the residual stream's Δ with depth; under μP every Δ is flat across
width, under CompleteP also across depth. Slopes are log-log against width or depth, computed at every
step and averaged over the steps (so one step's noise cannot make or break a slope).

The depth diagnostic tells α = 1 from α = 0.5. CompleteP's authors measure how far a layer's output
after training is from its linearisation in that layer's parameters (their relative distance from
linearisation): α = 1 keeps it the same at every depth (every layer learns non-linear features),
α = 0.5 makes it fall as depth^-1/2 (deep layers learn lazily). Here, per block and step: with the
block's input fixed at its initial value x, g(θ) = block(x; θ) − x, the block's parameters' change
Δ = θ_t − θ_0 and J the Jacobian of g at θ_0, the distance is
|g(θ_t) − g(θ_0) − J·Δ| / |g(θ_t) − g(θ_0)|: the share of the block's change that its linearisation
misses (a ratio of RMS sizes, so the branch multiplier cancels). Adam's steps have about the size of
the block rate, which CompleteP scales by m_L^(α−1); the second-order part grows with the step's
square, so the share scales as m_L^(α−1): slope 0 at α = 1, −1/2 at α = 0.5. The reference normalises
by the linearised output itself instead; that denominator is dominated by g(θ_0) and hides the change.

    python benchmarks/coord_check.py --out results/hp_transfer2/coord_check.png \
        --json results/hp_transfer2/coord_check.json
    python benchmarks/coord_check.py --replot results/hp_transfer2/coord_check.json --out coord_check.png
    python benchmarks/coord_check.py --widths 32 64 --depths 1 2 --steps 3 --json coord.json

Units: RMS in the activations' own units (residual stream entries; logits in nats); widths in
channels; the rate is the peak AdamW step size at the base shape. CPU: a few minutes on 2 cores.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # this checkout's scaling package

PARAMETRIZATIONS = ("standard", "mup", "completep", "completep-a0.5")
# The quantities plotted and fitted (Δ, or the linearisation share), and what they are.
QUANTITIES = {"embedding": "embedding output", "qk": "attention logits q·k (mean over blocks)",
              "ff_hidden": "feed-forward hidden (mean over blocks)",
              "attention": "attention outputs (mean over blocks)",
              "mlp": "feed-forward outputs (mean over blocks)", "residual": "residual stream after the last block",
              "final_norm": "final norm output", "logits": "logits", "update_hidden": "hidden matrices' update",
              "update_other": "other parameters' update"}
LINEARIZATION = "linearization"  # the depth diagnostic's quantity (mean over blocks)


def spec(name: str) -> tuple[str, float]:
    """``completep-a0.5`` -> (``completep``, 0.5); a plain name has α = 1."""
    parametrization, _, alpha = name.partition("-a")
    return parametrization, float(alpha) if alpha else 1.0


def coord_config(name: str, depth: int, width: int, *, base_width: int = 64, base_depth: int = 2, lr: float = 1e-2,
                 batch_size: int = 8, seq_len: int = 64, steps: int = 5, heads: int = 2):
    """The training config of one run: byte-level LM on the built-in corpus, ``heads`` heads (their size
    grows with width, so μP's attention rule acts), AdamW at a constant ``lr`` without warmup, weight decay
    0.1, clipping at 1, epsilon 1e-8 under the references' rules."""
    from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig

    parametrization, alpha = spec(name)
    return TrainConfig(
        model=ModelConfig(depth=depth, width=width, num_heads=heads, max_seq_len=seq_len),
        data=DataConfig(source="builtin", seq_len=seq_len),
        optim=OptimConfig(peak_lr=lr, parametrization=parametrization, base_width=base_width, base_depth=base_depth,
                          depth_alpha=alpha, warmup_steps=0, schedule="constant", weight_decay=0.1, grad_clip=1.0,
                          eps=1e-8, eps_rule="blocks", mup_weight_decay="width", mup_out_init="base"),
        steps=steps, batch_size=batch_size, eval_every=0, wandb_mode="disabled", name="coord_check")


def _rms(array) -> float:
    array = np.asarray(array, np.float64)
    return float(np.sqrt(np.mean(array**2)))


_CAPTURED = ("query", "key", "wi", "final_norm")  # sub-modules whose outputs the probe reads by name


@functools.lru_cache(maxsize=8)
def _probe(model_config, multipliers):
    """A jitted forward pass of the unrolled model returning its named activations."""
    import jax
    import jax.numpy as jnp

    from scaling.model.transformer import (Block, FeedForward, SelfAttention, Transformer, attention_logit_scale,
                                           rotary_positions)

    config = dataclasses.replace(model_config, scan_layers=False)
    model = Transformer(config, multipliers=multipliers)
    wanted = (Block, SelfAttention, FeedForward)

    def keep(module, method):
        return method == "__call__" and (isinstance(module, wanted) or module.name in _CAPTURED)

    def logits_qk(layer, batch, length):
        query, key = (layer["attention"][name]["__call__"][0].reshape(batch, length, config.heads, -1)
                      for name in ("query", "key"))
        if config.position == "rope":
            query, key = rotary_positions(query), rotary_positions(key)
        scores = jnp.einsum("bqhd,bkhd->bhqk", query, key) * attention_logit_scale(config, length, None,
                                                                                   multipliers.attention)
        below = np.tril(np.ones((length, length), bool))  # the causal entries (a constant mask), those the softmax sees
        return scores[:, :, below]

    def forward(params, tokens):
        logits, state = model.apply({"params": params}, tokens, capture_intermediates=keep, mutable=["intermediates"])
        found = state["intermediates"]
        named = {"logits": logits, "embedding": found["embedded"][0],
                 "final_norm": found["final_norm"]["__call__"][0]}
        for index in range(config.depth):
            layer = found[f"layers_{index}"]
            named[f"attention_{index}"] = layer["attention"]["__call__"][0]
            named[f"mlp_{index}"] = layer["mlp"]["__call__"][0]
            named[f"ff_hidden_{index}"] = layer["mlp"]["wi"]["__call__"][0]
            named[f"qk_{index}"] = logits_qk(layer, *tokens.shape)
            named[f"residual_{index}"] = layer["__call__"][0][0]  # a block returns (x, None)
        return named

    return jax.jit(forward)


@functools.lru_cache(maxsize=8)
def _linearization(model_config, multipliers):
    """A jitted function of (initial block parameters, later ones, block input): the share of the block's
    change g(θ_t) − g(θ_0) that its first-order Taylor expansion around θ_0 misses (RMS over RMS)."""
    import jax
    import jax.numpy as jnp

    from scaling.model.cpu_matmul import plain_products
    from scaling.model.transformer import Block

    block = Block(dataclasses.replace(model_config, scan_layers=False), multipliers=multipliers)

    def distance(initial, later, inputs):
        def change(params):
            return block.apply({"params": params}, inputs, None)[0] - inputs

        moved = jax.tree_util.tree_map(lambda new, old: new - old, later, initial)
        with plain_products():  # traced here: jax.jvp is forward mode, which the CPU product's custom VJP lacks
            start, linear = jax.jvp(change, (initial,), (moved,))
            total = change(later) - start
        return jnp.sqrt(jnp.mean((total - linear) ** 2)) / jnp.sqrt(jnp.mean(total ** 2))

    return jax.jit(distance)


def measure(config, steps: int | None = None) -> list[dict]:
    """Train ``config`` for ``steps`` steps (default ``config.steps``) on one device; per step, the RMS
    of every probed activation (``NAME``), of its change since initialisation (``delta_NAME``), each
    parameter group's update (``update_GROUP``) and each block's linearisation share (``linearization_I``)."""
    import jax

    from scaling.data import pipeline as data
    from scaling.model import mesh as mesh_lib, optim as optim_lib, parametrization, program as program_lib
    from scaling.model.transformer import unstack_layers

    steps = config.steps if steps is None else steps
    mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:1])
    program = program_lib.build(config, mesh)
    multipliers = parametrization.multipliers(config.optim, config.model)
    probe, linearization = _probe(config.model, multipliers), _linearization(config.model, multipliers)
    pipeline = data.build(config.data)
    hparams = program_lib.hyperparameters(config)
    state = program.init(jax.random.PRNGKey(config.seed))
    fixed = np.asarray(pipeline.validation_batches(config.batch_size, 1)[0]["inputs"])  # held out, never trained on

    def host_params():
        return unstack_layers(jax.tree_util.tree_map(np.asarray, state["params"]), config.model.depth)

    first = host_params()
    initial = {name: np.asarray(value) for name, value in probe(first, fixed).items()}
    block_inputs = [initial["embedding"]] + [initial[f"residual_{i}"] for i in range(config.model.depth - 1)]
    rows = []
    for step in range(steps):
        before = jax.tree_util.tree_map(np.asarray, state["params"])
        batch = {key: np.asarray(value) for key, value in
                 pipeline.train_batch(config.seed, step, config.batch_size).items()}
        state, _ = program.train_step(state, mesh_lib.global_batch(batch, mesh, config.batch_size), hparams)
        now_params = host_params()
        row = {"step": step + 1}
        for name, value in probe(now_params, fixed).items():
            row[name], row[f"delta_{name}"] = _rms(value), _rms(np.asarray(value) - initial[name])
        for index, inputs in enumerate(block_inputs):
            layer = f"layers_{index}"
            row[f"linearization_{index}"] = float(linearization(first[layer], now_params[layer], inputs))
        after = jax.tree_util.tree_map(np.asarray, state["params"])
        moved: dict[str, list] = {}
        for (path, old), new in zip(jax.tree_util.tree_flatten_with_path(before)[0], jax.tree_util.tree_leaves(after)):
            moved.setdefault(optim_lib.group_of(config.optim, path), []).append((new - old).ravel())
        for group, parts in moved.items():
            row[f"update_{group}"] = _rms(np.concatenate(parts))
        rows.append(row)
    return rows


def summary(row: dict, depth: int) -> dict:
    """The plotted quantities (``QUANTITIES`` and ``LINEARIZATION``) of one step's row."""
    def mean(name):
        return float(np.mean([row[f"{name}_{i}"] for i in range(depth)]))

    return {"embedding": row["delta_embedding"], "qk": mean("delta_qk"), "ff_hidden": mean("delta_ff_hidden"),
            "attention": mean("delta_attention"), "mlp": mean("delta_mlp"),
            "residual": row[f"delta_residual_{depth - 1}"], "final_norm": row["delta_final_norm"],
            "logits": row["delta_logits"], "update_hidden": row["update_hidden"], "update_other": row["update_other"],
            LINEARIZATION: mean("linearization")}


def run(parametrizations=PARAMETRIZATIONS, widths=(64, 128, 256, 512), depths=(2, 4, 8, 16), *, base_width: int = 64,
        base_depth: int = 2, steps: int = 5, lr: float = 1e-2, batch_size: int = 8, seq_len: int = 64, heads: int = 2,
        log=None) -> list[dict]:
    """One record per (parametrization, shape): widths at ``base_depth`` (``axis="width"``) and depths at
    ``base_width`` (``axis="depth"``; the base shape appears on both axes, measured once). A member of
    CompleteP's family with α other than 1 is measured along depth only (α acts on depth alone)."""
    records, measured = [], {}
    for name in parametrizations:
        shapes = [("depth", depth, base_width) for depth in depths]
        if spec(name)[1] == 1.0:
            shapes = [("width", base_depth, width) for width in widths] + shapes
        for axis, depth, width in shapes:
            if (name, depth, width) not in measured:
                started = time.perf_counter()
                config = coord_config(name, depth, width, base_width=base_width, base_depth=base_depth, lr=lr,
                                      batch_size=batch_size, seq_len=seq_len, steps=steps, heads=heads)
                measured[name, depth, width] = measure(config)
                if log:
                    log(f"{name:>14} L={depth:<3} d={width:<4} {time.perf_counter() - started:5.1f} s")
            rows = measured[name, depth, width]
            records.append({"parametrization": name, "axis": axis, "depth": depth, "width": width, "steps": rows,
                            "by_step": [summary(row, depth) for row in rows]})
    return records


def slopes(records: list[dict], parametrization: str, axis: str, quantity: str) -> list[float]:
    """Log-log slope of ``quantity`` against ``axis`` (width or depth) at each step: 0 is flat, 1 proportional."""
    chosen = sorted((r for r in records if r["parametrization"] == parametrization and r["axis"] == axis),
                    key=lambda r: r[axis])
    x = np.log([r[axis] for r in chosen])
    return [float(np.polyfit(x, np.log([r["by_step"][step][quantity] for r in chosen]), 1)[0])
            for step in range(len(chosen[0]["by_step"]))]


def slope(records: list[dict], parametrization: str, axis: str, quantity: str) -> float:
    """The mean over steps of ``slopes``: the slope a check reports and a test asserts."""
    return float(np.mean(slopes(records, parametrization, axis, quantity)))


def _panel(panel, records, name, axis, quantities):
    chosen = sorted((r for r in records if r["parametrization"] == name and r["axis"] == axis), key=lambda r: r[axis])
    if len(chosen) < 2:  # not measured along this axis
        panel.set_axis_off()
        return
    for quantity in quantities:
        xs, ys = [r[axis] for r in chosen], [r["by_step"][-1][quantity] for r in chosen]
        line, = panel.plot(xs, ys, marker="o", label=QUANTITIES.get(quantity, quantity))
        panel.annotate(f"{slope(records, name, axis, quantity):+.2f}", (xs[-1], ys[-1]), xytext=(4, 0),
                       textcoords="offset points", va="center", fontsize=7, color=line.get_color())
    fixed = f"depth {chosen[0]['depth']}" if axis == "width" else f"width {chosen[0]['width']}"
    panel.set(xscale="log", yscale="log", xlabel=axis, title=f"{name}: against {axis} ({fixed})")
    panel.minorticks_off()
    panel.set_xticks([r[axis] for r in chosen], [str(r[axis]) for r in chosen])
    panel.margins(x=0.2)


def plot(records: list[dict], path: str) -> None:
    """Δ at the last step against width (top row) and depth (middle row), a column per parametrization, and the
    depth diagnostic (bottom): the blocks' linearisation share against depth; numbers are slopes averaged over steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["parametrization"] for r in records))
    figure, axes = plt.subplots(3, len(names), figsize=(4.4 * len(names), 12.0), squeeze=False)
    for row, axis in enumerate(("width", "depth")):
        for column, name in enumerate(names):
            _panel(axes[row][column], records, name, axis, QUANTITIES)
            if column == 0:
                axes[row][column].set_ylabel(f"RMS of the change after {len(records[0]['steps'])} AdamW steps")
    diagnostic = axes[2][0]
    for name in names:
        chosen = sorted((r for r in records if r["parametrization"] == name and r["axis"] == "depth"),
                        key=lambda r: r["depth"])
        if len(chosen) >= 2:
            xs, ys = [r["depth"] for r in chosen], [r["by_step"][-1][LINEARIZATION] for r in chosen]
            fitted = slope(records, name, "depth", LINEARIZATION)
            diagnostic.plot(xs, ys, marker="o", label=f"{name} ({fitted:+.2f})")
    diagnostic.set(xscale="log", yscale="log", xlabel="depth",
                   ylabel="share of a block's change its linearisation misses",
                   title="depth diagnostic (slope over steps)")
    depths = sorted({r["depth"] for r in records if r["axis"] == "depth"})
    diagnostic.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    diagnostic.set_xticks(depths, [str(depth) for depth in depths])
    diagnostic.legend(fontsize=7)
    for panel in axes[2][1:]:
        panel.set_axis_off()
    handles, labels = next(panel.get_legend_handles_labels() for panel in axes[0] if panel.lines)
    figure.legend(handles, labels, loc="lower right", ncol=2, fontsize=8, frameon=False,
                  title="quantity (numbers at the line ends: log-log slopes, mean over steps)", title_fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def print_slopes(records: list[dict], names) -> None:
    """A table of slopes (mean over steps) per parametrization, axis and quantity."""
    quantities = list(QUANTITIES) + [LINEARIZATION]
    print("log-log slope of each quantity against width or depth, mean over the steps")
    print(f"{'parametrization':>15} {'axis':>6} " + " ".join(f"{q[:12]:>12}" for q in quantities))
    for name in names:
        for axis in ("width", "depth"):
            if sum(r["parametrization"] == name and r["axis"] == axis for r in records) >= 2:
                values = " ".join(f"{slope(records, name, axis, q):>12.2f}" for q in quantities)
                print(f"{name:>15} {axis:>6} {values}")


def main(argv=None) -> int:
    from scaling import cli

    parser = cli.doc_parser(__doc__, prog="python benchmarks/coord_check.py")
    parser.add_argument("--parametrizations", nargs="+", choices=PARAMETRIZATIONS, default=list(PARAMETRIZATIONS))
    parser.add_argument("--widths", nargs="+", type=int, default=[64, 128, 256, 512],
                        help="widths at the base depth, channels (default: %(default)s)")
    parser.add_argument("--depths", nargs="+", type=int, default=[2, 4, 8, 16],
                        help="depths at the base width (default: %(default)s)")
    parser.add_argument("--base-width", type=int, default=64, help="optim.base_width (default: 64)")
    parser.add_argument("--base-depth", type=int, default=2, help="optim.base_depth (default: 2)")
    parser.add_argument("--steps", type=int, default=5, help="AdamW steps (default: 5)")
    parser.add_argument("--lr", type=float, default=1e-2, help="peak rate at the base shape (default: 1e-2)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step (default: 8)")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default: 64)")
    parser.add_argument("--heads", type=int, default=2, help="attention heads at every width (default: 2)")
    parser.add_argument("--out", help="write the figure to this PNG")
    parser.add_argument("--json", help="write every record (all steps, all activations) to this file")
    parser.add_argument("--replot", metavar="JSON", help="draw --out from a file --json wrote, training nothing")
    args = parser.parse_args(argv)
    if args.replot:
        if not args.out:
            parser.error("--replot needs --out")
        with open(args.replot) as file:
            plot(json.load(file)["records"], args.out)
        return 0
    if min(args.widths + args.depths + [args.steps, args.batch_size, args.seq_len, args.heads]) < 1 or not args.lr > 0:
        parser.error("widths, depths, steps, batch size, sequence length and heads must be >= 1, the rate > 0")
    if len(set(args.widths)) < 2 or len(set(args.depths)) < 2:
        parser.error("give at least two widths and two depths (a slope needs two points)")
    if any(width % args.heads for width in args.widths + [args.base_width]):
        parser.error(f"every width must split into --heads {args.heads} heads")
    records = run(args.parametrizations, args.widths, args.depths, base_width=args.base_width,
                  base_depth=args.base_depth, steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                  seq_len=args.seq_len, heads=args.heads, log=lambda line: print(line, file=sys.stderr, flush=True))
    print_slopes(records, args.parametrizations)
    if args.out:
        plot(records, args.out)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"settings": {k: v for k, v in vars(args).items() if k not in ("out", "json", "replot")},
                       "records": records}, file, indent=1)
    return 0


if __name__ == "__main__":
    from scaling.entry import prepare_process

    prepare_process()  # as every command line does first: no TPU probe on a CPU machine; the storage emulator
    sys.exit(main())
