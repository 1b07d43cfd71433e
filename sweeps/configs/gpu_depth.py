"""The project's own depth transitions on one GPU: depths 3, 6, 9, 12, byte-level, 20 tokens per parameter.

    python -m scaling.corpus build --out ~/.cache/scaling-data/debian-docs-prose   # once, on a Debian machine
    python -m sweeps.launch dry-run sweeps/configs/gpu_depth.py                    # stage 1: runs, GPU-minutes
    gpu/run_stage.sh --stage 1 --budget 30m --corpus gpu/data/tokens.tar.xz        # as often as it takes
    python -m sweeps.configs.gpu_depth choose results/gpu_depth/gpu_depth --out results/gpu_depth/stage2_sizes.json
    GPU_DEPTH_STAGE=2 python -m sweeps.launch dry-run sweeps/configs/gpu_depth.py  # stage 2: runs, GPU-minutes
    gpu/run_stage.sh --stage 2 --budget 30m --corpus gpu/data/tokens.tar.xz
    python -m analysis fit results/gpu_depth/gpu_depth_stage2                       # the pre-registered test

``results/gpu_depth/README.md`` holds the pre-registered criterion, the design
and the budget; this file is the design in code.

Pairs (3, 6), (6, 9), (9, 12): depth ratios 2, 1.5 and 1.33, like the paper's
(6, 12), (12, 18), (18, 24). The paper's fit (a = 5.039, b = 0.0555) puts the
shallower depths' transitions at widths 182, 215, 254 (N ≈ 1.2e6, 3.3e6, 7.0e6).

Stage 1, the scout (``GPU_DEPTH_STAGE=1``, the default; sweep ``gpu_depth``):
one seed (0); for each pair, both depths at N_tr(L_shallow)·{1/3, 2/3, 4/3, 8/3}
(a ×2 ladder from N_tr/3 up to 4·N_tr), widths multiples of 16. Stage 2, the
confirmation (``GPU_DEPTH_STAGE=2``; sweep ``gpu_depth_stage2``): four new seeds
(1 to 4, none shared with the scout, so the test does not reuse the data that
placed it) on a √2 ladder of 5 sizes centred on each pair's crossing, as
``choose`` reads it from the scout's records and writes to
``results/gpu_depth/stage2_sizes.json`` (``GPU_DEPTH_SIZES`` names another file).

Training: byte-level causal LM on the Debian documentation corpus
(``scaling.data.corpus_build``; ``data.cache_dir`` is set by ``gpu/run_stage.sh``),
sequences of 512 tokens, batches of 32, each run 20 tokens per non-embedding
parameter (``Sweep.tokens_per_param``), so both depths of a size see the same
tokens in the same order for a seed. Pre-LN, ReLU, feed-forward 4·d, 16-channel
heads, learned positions, bfloat16 compute with float32 parameters. One peak
rate 2e-3 for every depth and width (constant rule), AdamW (0.9, 0.95), weight
decay 0.1, clipping 1.0, 100 warmup steps, cosine to 10%. Evaluated once at the
end on 32 batches of 32 held-out sequences (524,288 tokens).

``GPU_DEPTH_MICRO=1`` gives a micro version of both stages (depths 1 and 2,
widths 8 to 48, 32-token sequences, 4 tokens per parameter, CPU float32): the
machinery end to end in about a minute on a CPU, for tests; it says nothing
about depth.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys

import numpy as np

from scaling import hardware
from scaling.config import ModelConfig, OptimConfig, TrainConfig
from scaling.data.corpus_build import data_config
from sweeps.spec import Sweep

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_SIZES_FILE = REPO / "results" / "gpu_depth" / "stage2_sizes.json"
H100_BF16_PEAK = hardware.H100.peak_flops("bfloat16")  # FLOP/s, dense, SXM; for MFU and dry-run's time
EXPECTED_MFU = (0.05, 0.10)  # pessimistic for models this small (widths 64 to 416)
TOKENS_PER_PARAM = 20.0  # training tokens per non-embedding parameter (10 if stage 1 is too slow: see README)
SCOUT_LOSS_STD = 0.007  # nats per token: seed noise at this scale (0.006 to 0.008), for the one-seed scout


@dataclasses.dataclass(frozen=True)
class Design:
    """One version of the experiment (full, or micro for tests).

    ``centres``: the scout's centre size N (non-embedding parameters) for each
    pair, keyed by its shallower depth. The scout runs both depths of a pair at
    ``centre × scout_factors``; stage 2 runs ``confirm_sizes`` sizes spaced by
    ``confirm_ratio`` around the size ``choose`` finds, with ``confirm_seeds``.
    """

    name: str
    depths: tuple[int, ...]
    centres: dict
    scout_factors: tuple[float, ...]
    confirm_sizes: int
    confirm_ratio: float
    confirm_seeds: tuple[int, ...]
    tokens_per_param: float
    multiple_of: int
    base: TrainConfig

    def __post_init__(self):
        pairs = set(zip(self.depths[:-1], self.depths[1:]))
        if set(self.centres) != {shallow for shallow, _ in pairs}:
            raise ValueError(f"centres keys {sorted(self.centres)} must be the shallower depths of the pairs "
                             f"{sorted(pairs)}")
        if self.confirm_sizes < 2 or self.confirm_ratio <= 1:
            raise ValueError(f"confirm_sizes={self.confirm_sizes} must be >= 2 and confirm_ratio="
                             f"{self.confirm_ratio} > 1")

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.depths[:-1], self.depths[1:]))


def _transition_params(depth: int) -> float:
    """N_tr(L) from the paper's fit, in parameters."""
    from analysis.projection import FIT_PRESETS, transition_params

    return float(transition_params(depth, FIT_PRESETS["levine2020"]))


def full_design() -> Design:
    base = TrainConfig(
        model=ModelConfig(head_dim=16, max_seq_len=512, compute_dtype="bfloat16", param_dtype="float32"),
        data=data_config(seq_len=512),
        optim=OptimConfig(peak_lr=2e-3, lr_rule="constant", warmup_steps=100, schedule="cosine",
                          end_lr_fraction=0.1, weight_decay=0.1, grad_clip=1.0),
        steps=1000,  # replaced per run by tokens_per_param
        batch_size=32, eval_every=0, eval_batches=32, eval_at_start=False, checkpoint_every=1000,
        log_every=100, peak_flops=H100_BF16_PEAK, wandb_mode="offline")
    depths = (3, 6, 9, 12)
    return Design(name="gpu_depth", depths=depths, centres={d: _transition_params(d) for d in depths[:-1]},
                  scout_factors=(1 / 3, 2 / 3, 4 / 3, 8 / 3), confirm_sizes=5, confirm_ratio=math.sqrt(2.0),
                  confirm_seeds=(1, 2, 3, 4), tokens_per_param=TOKENS_PER_PARAM, multiple_of=16, base=base)


def micro_design() -> Design:
    base = TrainConfig(
        model=ModelConfig(head_dim=8, max_seq_len=32),
        data=data_config(seq_len=32),
        optim=OptimConfig(peak_lr=1e-2, lr_rule="constant", warmup_steps=5, schedule="cosine"),
        steps=10, batch_size=8, eval_every=0, eval_batches=2, eval_at_start=False, checkpoint_every=1000,
        log_every=10, wandb_mode="disabled")
    return Design(name="gpu_depth_micro", depths=(1, 2), centres={1: 8e3}, scout_factors=(0.5, 2.0),
                  confirm_sizes=3, confirm_ratio=2.0, confirm_seeds=(1, 2), tokens_per_param=4.0, multiple_of=8,
                  base=base)


def design() -> Design:
    """The design the environment asks for: ``GPU_DEPTH_MICRO=1`` gives the micro version."""
    return micro_design() if os.environ.get("GPU_DEPTH_MICRO", "") not in ("", "0") else full_design()


def _budgets(design_: Design, sizes_per_pair: dict) -> dict:
    """Budgets per depth: the union of the sizes of the pairs each depth belongs to."""
    budgets: dict[int, set] = {depth: set() for depth in design_.depths}
    for (shallow, deep), sizes in sizes_per_pair.items():
        budgets[shallow].update(sizes)
        budgets[deep].update(sizes)
    return {depth: tuple(sorted(values)) for depth, values in budgets.items() if values}


def scout(design_: Design | None = None) -> Sweep:
    """Stage 1: one seed, both depths of each pair on a ×2 ladder around the predicted transition."""
    d = design_ or design()
    sizes = {(s, t): [d.centres[s] * f for f in d.scout_factors] for s, t in d.pairs}
    return Sweep(name=d.name, base=d.base, depths=d.depths, budgets=_budgets(d, sizes), seeds=(0,),
                 multiple_of=d.multiple_of, tokens_per_param=d.tokens_per_param,
                 expected_mfu=EXPECTED_MFU if d.base.peak_flops == H100_BF16_PEAK else None)


def confirmation(chosen: dict, design_: Design | None = None) -> Sweep:
    """Stage 2 from ``choose``'s output: the chosen sizes of every pair, ``confirm_seeds`` each."""
    d = design_ or design()
    if chosen.get("design") != d.name:
        raise ValueError(f"the stage-2 sizes were chosen for design {chosen.get('design')!r}, not {d.name!r}")
    sizes = {(p["shallow_depth"], p["deep_depth"]): p["sizes"] for p in chosen["pairs"]}
    budgets = _budgets(d, sizes)
    return Sweep(name=f"{d.name}_stage2", base=d.base, depths=tuple(sorted(budgets)), budgets=budgets,
                 seeds=d.confirm_seeds, multiple_of=d.multiple_of, tokens_per_param=d.tokens_per_param,
                 expected_mfu=EXPECTED_MFU if d.base.peak_flops == H100_BF16_PEAK else None)


def sweep() -> Sweep:
    """Stage 1, or stage 2 with ``GPU_DEPTH_STAGE=2`` (sizes from ``GPU_DEPTH_SIZES`` or the default file)."""
    stage = os.environ.get("GPU_DEPTH_STAGE", "1")
    if stage == "1":
        return scout()
    if stage != "2":
        raise ValueError(f"GPU_DEPTH_STAGE={stage!r} is invalid: allowed 1 or 2")
    path = pathlib.Path(os.environ.get("GPU_DEPTH_SIZES") or DEFAULT_SIZES_FILE)
    if not path.is_file():
        raise ValueError(f"no stage-2 sizes at {path}; choose them from the scout's records first: "
                         "python -m sweeps.configs.gpu_depth choose SCOUT_DIR --out " + str(path))
    return confirmation(json.loads(path.read_text()))


# ---------------------------------------------------------------------------
# Choosing stage 2's sizes from the scout's records


def choose(scout_dir, design_: Design | None = None, loss_std: float = SCOUT_LOSS_STD) -> dict:
    """Stage 2's sizes per pair from the scout's finished records in ``scout_dir``.

    Each pair is centred on the zero crossing of its loss difference
    (``analysis.transition``, seed noise ``loss_std`` nats per token since the
    scout has one seed); without one, on the compared size where |difference| is
    smallest (the pair's transition lies at or beyond that end of the scout's
    range); without any compared size, on the predicted centre. Sizes are
    ``centre · confirm_ratio^k`` for k centred on 0 (non-embedding parameters).
    """
    from analysis.results import load_runs
    from analysis.transition import find_transitions

    d = design_ or design()
    table = load_runs(str(scout_dir))
    transitions, test = find_transitions(table.runs, loss_std=loss_std, n_bootstrap=0)
    by_pair = {(t.shallow_depth, t.deep_depth): t for t in transitions}
    steps = np.arange(d.confirm_sizes) - (d.confirm_sizes - 1) / 2
    pairs = []
    for shallow, deep in d.pairs:
        found = by_pair.get((shallow, deep))
        if found is not None and found.crossing.width is not None:
            centre, basis = 12.0 * shallow * found.crossing.width ** 2, "zero crossing of the scout's loss difference"
        elif found is not None and found.comparison is not None:
            k = int(np.argmin(np.abs(found.comparison.diff)))
            centre = float(found.comparison.params[k])
            basis = f"no crossing in the scout's range ({found.status}); smallest |difference| there"
        else:
            centre, basis = d.centres[shallow], "no comparable scout sizes; the predicted transition"
        pairs.append({"shallow_depth": shallow, "deep_depth": deep, "centre_params": centre, "basis": basis,
                      "scout_status": found.status if found else "missing",
                      "sizes": [float(centre * d.confirm_ratio ** k) for k in steps]})
    return {"design": d.name, "scout": str(scout_dir), "loss_std": loss_std, "test": test,
            "scout_runs": int(len(table.runs)), "pairs": pairs}


def main(argv=None) -> int:
    """``python -m sweeps.configs.gpu_depth choose SCOUT_DIR --out FILE``."""
    parser = argparse.ArgumentParser(prog="python -m sweeps.configs.gpu_depth",
                                     description="Choose stage 2's sizes from the scout's run records.")
    commands = parser.add_subparsers(dest="command", required=True)
    chooser = commands.add_parser("choose", help="write stage 2's sizes per pair (JSON) from the scout's records",
                                  description=choose.__doc__.split("\n\n")[1].strip())
    chooser.add_argument("scout_dir", help="the scout's sweep directory, e.g. results/gpu_depth/gpu_depth")
    chooser.add_argument("--out", required=True, type=pathlib.Path, help="JSON file to write")
    chooser.add_argument("--loss-std", type=float, default=SCOUT_LOSS_STD,
                         help=f"seed noise in nats per token for the one-seed scout (default {SCOUT_LOSS_STD})")
    args = parser.parse_args(argv)
    from analysis.errors import AnalysisInputError

    try:
        chosen = choose(args.scout_dir, loss_std=args.loss_std)
        confirmation(chosen)  # the sizes must make a valid sweep before they are written
    except (AnalysisInputError, ValueError) as error:
        print(f"{parser.prog} choose: error: {error}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(chosen, indent=1) + "\n")
    for pair in chosen["pairs"]:
        print(f"L={pair['shallow_depth']} vs L={pair['deep_depth']}: centre N={pair['centre_params']:.3g} "
              f"({pair['basis']}); sizes {', '.join(f'{n:.3g}' for n in pair['sizes'])}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
