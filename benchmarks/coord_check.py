"""Coordinate check: activation and update sizes over the first Adam steps across widths and depths, by parametrization.

For each parametrization (``optim.parametrization``: standard, mup,
completep) and each shape, the trainer's own step
(``scaling.model.program.build(config, mesh).train_step``) takes ``--steps`` Adam
steps on the built-in corpus from the base shape's rate, and after each step
a fixed batch is run through the model to read the root-mean-square (RMS)
size of every block's attention and feed-forward outputs, of the residual
stream after each block, and of the logits; both the RMS itself and the RMS
of its change since initialisation (Δ, the part training adds). The RMS of
each parameter group's update (hidden matrices, the rest) is recorded too.
Widths vary at the base depth, depths at the base width.

What the parametrizations promise ("Tensor Programs V", section 6 and its
coordinate-check figures; "Don't be lazy: CompleteP enables compute-efficient
deep transformers"): under standard parametrization Δlogits grows with width
(Adam moves every weight by about the rate, and a width-d dot product sums d
such moves) and the residual stream's Δ grows with depth (each of L branches
adds its own); under μP Δ is flat across widths, under CompleteP also across
depths. The figure plots Δ at the last step against width and against depth,
one panel per parametrization; the table gives each curve's log-log slope.

    python benchmarks/coord_check.py --out results/hp_transfer/coord_check.png \
        --json results/hp_transfer/coord_check.json
    python benchmarks/coord_check.py --replot results/hp_transfer/coord_check.json --out coord_check.png
    python benchmarks/coord_check.py --widths 32 64 --depths 1 2 --steps 3 --json coord.json

Units: RMS in the activations' own units (the residual stream's entries;
logits in nats); widths in channels; the rate is the peak AdamW step size at
the base shape. CPU: about two minutes for the defaults on 2 cores.
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

PARAMETRIZATIONS = ("standard", "mup", "completep")
# The quantities plotted and fitted: Δ at the last step.
QUANTITIES = {"logits": "logits", "residual": "residual stream after the last block",
              "attention": "attention outputs (mean over blocks)", "mlp": "feed-forward outputs (mean over blocks)",
              "update_hidden": "hidden matrices' update", "update_other": "other parameters' update"}


def coord_config(parametrization: str, depth: int, width: int, *, base_width: int = 64, base_depth: int = 2,
                 lr: float = 1e-2, batch_size: int = 8, seq_len: int = 64, steps: int = 5):
    """The training config of one coordinate-check run: byte-level LM on the built-in corpus, heads of
    16 channels, AdamW at a constant ``lr`` without warmup, weight decay or clipping (so nothing but the
    parametrization sets the update sizes)."""
    from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig

    return TrainConfig(
        model=ModelConfig(depth=depth, width=width, head_dim=16, max_seq_len=seq_len),
        data=DataConfig(source="builtin", seq_len=seq_len),
        optim=OptimConfig(peak_lr=lr, parametrization=parametrization, base_width=base_width, base_depth=base_depth,
                          warmup_steps=0, schedule="constant", weight_decay=0.0, grad_clip=0.0),
        steps=steps, batch_size=batch_size, eval_every=0, wandb_mode="disabled", name="coord_check")


def _rms(array) -> float:
    array = np.asarray(array, np.float64)
    return float(np.sqrt(np.mean(array**2)))


@functools.lru_cache(maxsize=8)
def _probe(model_config, multipliers):
    """A jitted forward pass of the unrolled model returning its named activations."""
    import jax

    from scaling.model.transformer import Block, FeedForward, SelfAttention, Transformer

    model = Transformer(dataclasses.replace(model_config, scan_layers=False), multipliers=multipliers)
    wanted = (Block, SelfAttention, FeedForward)

    def forward(params, tokens):
        logits, state = model.apply({"params": params}, tokens, capture_intermediates=lambda module, method:
                                    method == "__call__" and isinstance(module, wanted), mutable=["intermediates"])
        found = state["intermediates"]
        named = {"logits": logits}
        for index in range(model_config.depth):
            layer = found[f"layers_{index}"]
            named[f"attention_{index}"] = layer["attention"]["__call__"][0]
            named[f"mlp_{index}"] = layer["mlp"]["__call__"][0]
            named[f"residual_{index}"] = layer["__call__"][0][0]  # a block returns (x, None)
        return named

    return jax.jit(forward)


def measure(config, steps: int | None = None) -> list[dict]:
    """Train ``config`` for ``steps`` steps (default ``config.steps``) on one device; per step, the RMS
    of every probed activation (``NAME``), of its change since initialisation (``delta_NAME``) and of
    each parameter group's update (``update_GROUP``)."""
    import jax

    from scaling.data import pipeline as data
    from scaling.model import mesh as mesh_lib, optim as optim_lib, parametrization, program as program_lib
    from scaling.model.transformer import unstack_layers

    steps = config.steps if steps is None else steps
    mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:1])
    program = program_lib.build(config, mesh)
    probe = _probe(config.model, parametrization.multipliers(config.optim, config.model))
    pipeline = data.build(config.data)
    hparams = program_lib.hyperparameters(config)
    state = program.init(jax.random.PRNGKey(config.seed))
    fixed = np.asarray(pipeline.train_batch(0, 0, config.batch_size)["inputs"])

    def activations(params):
        named = probe(unstack_layers(params, config.model.depth), fixed)
        return {name: np.asarray(value) for name, value in named.items()}

    def host_params():
        return jax.tree_util.tree_map(np.asarray, state["params"])

    initial, rows = activations(state["params"]), []
    for step in range(steps):
        before = host_params()
        batch = {key: np.asarray(value) for key, value in pipeline.train_batch(step, 0, config.batch_size).items()}
        state, _ = program.train_step(state, mesh_lib.global_batch(batch, mesh, config.batch_size), hparams)
        after, now = host_params(), activations(state["params"])
        row = {"step": step + 1}
        for name, value in now.items():
            row[name], row[f"delta_{name}"] = _rms(value), _rms(value - initial[name])
        moved: dict[str, list] = {}
        for (path, old), new in zip(jax.tree_util.tree_flatten_with_path(before)[0], jax.tree_util.tree_leaves(after)):
            moved.setdefault(optim_lib.group_of(config.optim, path), []).append((new - old).ravel())
        for group, parts in moved.items():
            row[f"update_{group}"] = _rms(np.concatenate(parts))
        rows.append(row)
    return rows


def summary(row: dict, depth: int) -> dict:
    """The plotted quantities (``QUANTITIES``) of one step's row."""
    return {"logits": row["delta_logits"], "residual": row[f"delta_residual_{depth - 1}"],
            "attention": float(np.mean([row[f"delta_attention_{i}"] for i in range(depth)])),
            "mlp": float(np.mean([row[f"delta_mlp_{i}"] for i in range(depth)])),
            "update_hidden": row["update_hidden"], "update_other": row["update_other"]}


def run(parametrizations=PARAMETRIZATIONS, widths=(64, 128, 256, 512), depths=(2, 4, 8, 16), *, base_width: int = 64,
        base_depth: int = 2, steps: int = 5, lr: float = 1e-2, batch_size: int = 8, seq_len: int = 64,
        log=None) -> list[dict]:
    """One record per (parametrization, shape): widths at ``base_depth`` (``axis="width"``) and depths at
    ``base_width`` (``axis="depth"``; the base shape appears on both axes, measured once)."""
    shapes = [("width", base_depth, width) for width in widths] + [("depth", depth, base_width) for depth in depths]
    records, measured = [], {}
    for name in parametrizations:
        for axis, depth, width in shapes:
            if (name, depth, width) not in measured:
                started = time.perf_counter()
                config = coord_config(name, depth, width, base_width=base_width, base_depth=base_depth, lr=lr,
                                      batch_size=batch_size, seq_len=seq_len, steps=steps)
                measured[name, depth, width] = measure(config)
                if log:
                    log(f"{name:>9} L={depth:<3} d={width:<4} {time.perf_counter() - started:5.1f} s")
            rows = measured[name, depth, width]
            records.append({"parametrization": name, "axis": axis, "depth": depth, "width": width,
                            "steps": rows, "last": summary(rows[-1], depth)})
    return records


def slope(records: list[dict], parametrization: str, axis: str, quantity: str) -> float:
    """Log-log slope of ``quantity`` (Δ at the last step) against ``axis`` (width or depth): 0 is flat,
    1 is proportional."""
    points = [(r[axis], r["last"][quantity]) for r in records if r["parametrization"] == parametrization
              and r["axis"] == axis]
    x, y = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return float(np.polyfit(x, y, 1)[0])


def plot(records: list[dict], path: str) -> None:
    """RMS of Δ at the last step against width (top row) and depth (bottom row), a column per parametrization."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["parametrization"] for r in records))
    figure, axes = plt.subplots(2, len(names), figsize=(4.4 * len(names), 8.0), sharey="row", squeeze=False)
    for row, axis in enumerate(("width", "depth")):
        for column, name in enumerate(names):
            panel = axes[row][column]
            chosen = sorted((r for r in records if r["parametrization"] == name and r["axis"] == axis),
                            key=lambda r: r[axis])
            if len(chosen) < 2:  # not measured along this axis
                panel.set_axis_off()
                continue
            for quantity in QUANTITIES:
                xs, ys = [r[axis] for r in chosen], [r["last"][quantity] for r in chosen]
                line, = panel.plot(xs, ys, marker="o", label=QUANTITIES[quantity])
                panel.annotate(f"{slope(records, name, axis, quantity):+.2f}", (xs[-1], ys[-1]), xytext=(4, 0),
                               textcoords="offset points", va="center", fontsize=7, color=line.get_color())
            fixed = f"depth {chosen[0]['depth']}" if axis == "width" else f"width {chosen[0]['width']}"
            steps = len(chosen[0]["steps"])
            panel.set(xscale="log", yscale="log", xlabel=axis, title=f"{name}: against {axis} ({fixed})")
            panel.minorticks_off()
            panel.set_xticks([r[axis] for r in chosen], [str(r[axis]) for r in chosen])
            panel.margins(x=0.15)
            if column == 0:
                panel.set_ylabel(f"RMS of the change after {steps} Adam steps")
    handles, labels = next(panel.get_legend_handles_labels() for panel in axes.flat if panel.lines)
    figure.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False,
                  title="quantity (numbers at the line ends: log-log slopes)", title_fontsize=8)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    figure.savefig(path, dpi=120)
    plt.close(figure)


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
    parser.add_argument("--steps", type=int, default=5, help="Adam steps (default: 5)")
    parser.add_argument("--lr", type=float, default=1e-2, help="peak rate at the base shape (default: 1e-2)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step (default: 8)")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default: 64)")
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
    if min(args.widths + args.depths + [args.steps, args.batch_size, args.seq_len]) < 1 or not args.lr > 0:
        parser.error("widths, depths, steps, batch size and sequence length must be >= 1, the rate > 0")
    if len(set(args.widths)) < 2 or len(set(args.depths)) < 2:
        parser.error("give at least two widths and two depths (a slope needs two points)")
    records = run(args.parametrizations, args.widths, args.depths, base_width=args.base_width,
                  base_depth=args.base_depth, steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                  seq_len=args.seq_len, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"log-log slope of each quantity's RMS change after {args.steps} steps")
    print(f"{'parametrization':>15} {'axis':>6} " + " ".join(f"{q:>13}" for q in QUANTITIES))
    for name in args.parametrizations:
        for axis in ("width", "depth"):
            print(f"{name:>15} {axis:>6} " + " ".join(f"{slope(records, name, axis, q):>13.2f}" for q in QUANTITIES))
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
