"""The project's own depth transitions on one GPU: depths 3, 6, 9, 12, byte-level, 8 tokens per parameter,
trained in pieces of one 8-minute command each (design v2, re-registered in ``results/gpu_depth/README.md``).

    python -m scaling.corpus build --out ~/.cache/scaling-data/debian-docs-prose \\
        --fingerprint results/gpu_depth/corpus_fingerprint.json                   # once, on Debian 12: verifies
    python -m sweeps.launch dry-run sweeps/configs/gpu_depth.py                    # stage 1 as pieces, the ledger
    gpu/piece.sh --stage 1 --commit "$(git rev-parse HEAD)"                        # on the lent GPU, one piece
    python -m sweeps.piece accept COPY_OF_OUT --stage 1                            # here: records into the ledger
    python -m sweeps.configs.gpu_depth choose results/gpu_depth/gpu_depth --out results/gpu_depth/stage2_sizes.json
    GPU_DEPTH_STAGE=2 python -m sweeps.launch dry-run sweeps/configs/gpu_depth.py  # stage 2 as pieces
    python -m analysis fit results/gpu_depth/gpu_depth_stage2                       # the pre-registered test

``results/gpu_depth/README.md`` holds the criterion, the design and its budget; this file is the design
in code. Pairs (3, 6), (6, 9), (9, 12): depth ratios 2, 1.5 and 1.33, like the paper's (6, 12), (12, 18),
(18, 24). The paper's fit (a = 5.039, b = 0.0555, made from depths 6 to 36) puts the shallower depths'
transitions at widths 182, 215, 254 (N ≈ 1.2e6, 3.3e6, 7.0e6); L = 3 lies below that range.

Each pair is compared at four sizes, two on each side of its centre, √2 apart (``LADDER``): the shallower
depth at the widths nearest those sizes (multiples of 16), the deeper depth at the widths nearest the
shallower's sizes, widened outwards where needed so that its range covers the shallower's within the
analysis' 5% (``analysis.comparison.RANGE_TOLERANCE``): every compared size survives rounding and the
range rule. Stage 1, the scout (``GPU_DEPTH_STAGE=1``, the default; sweep ``gpu_depth``): seed 0,
centred on the paper's prediction. Stage 2, the confirmation (``GPU_DEPTH_STAGE=2``; sweep
``gpu_depth_stage2``): seeds 1 to 4 on the same ladder centred where ``choose`` places each pair from the
scout's records (``results/gpu_depth/stage2_sizes.json``; ``GPU_DEPTH_SIZES`` names another file), plus a
rate check: at each depth's smallest width a run at 4e-3, at its largest one at 1e-3 (the standard
parametrization's best rate falls with width: ``results/hp_transfer``).

Training: byte-level causal LM on the Debian documentation corpus (``scaling.data.corpus_build``;
``data.cache_dir`` is set by the piece), sequences of 512 tokens, batches of 32, 8 tokens per
non-embedding parameter (``Sweep.tokens_per_param``). Pre-LN, ReLU, feed-forward 4·d, 16-channel heads,
learned positions, bfloat16 compute with float32 parameters. One peak rate 2e-3 for every shape (constant
rule) but the rate checks, AdamW (0.9, 0.95), weight decay 0.1, clipping 1.0, 100 warmup steps, cosine to
10%. Evaluated once at the end on 32 batches of 32 held-out sequences (524,288 tokens).

``GPU_DEPTH_MICRO=1`` gives a micro version of both stages (depths 1 and 2, 32-token sequences, 4 tokens
per parameter, CPU float32; its largest size is far beyond what a CPU trains in minutes, so that a micro
piece always leaves a run it cannot finish): the machinery end to end on a CPU, for tests; it says
nothing about depth.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

import numpy as np

from scaling import hardware
from scaling.config import ModelConfig, OptimConfig, TrainConfig
from scaling.data.corpus_build import data_config
from scaling.model import budget
from sweeps.piece.plan import PieceSettings, PieceSweep

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_SIZES_FILE = REPO / "results" / "gpu_depth" / "stage2_sizes.json"
H100_BF16_PEAK = hardware.H100.peak_flops("bfloat16")  # FLOP/s, dense, SXM (the H200's is the same)
EXPECTED_MFU = (0.05, 0.10)  # the range dry-run quotes the total at
TOKENS_PER_PARAM = 8.0  # training tokens per non-embedding parameter (20 and 10 did not fit the machine: README)
LADDER = (-0.75, -0.25, 0.25, 0.75)  # log2 offsets of a pair's compared sizes from its centre: √2 apart
RATE_CHECK = (4e-3, 1e-3)  # the rate tried at each depth's smallest width, and at its largest
RANGE_TOLERANCE = 0.05  # analysis.comparison.RANGE_TOLERANCE (a test keeps them equal; analysis is not imported)
SCOUT_LOSS_STD = 0.007  # nats per token: seed noise at this scale (0.006 to 0.008), for the one-seed scout
RATE_TOLERANCE = 0.02  # nats per token: a checked rate beating 2e-3 by more flags the depth (about 2 sigma)
GPU_PIECE = PieceSettings(seconds=480, startup_seconds=45, reserve_seconds=30, mfu=0.10, min_step_seconds=0.004,
                          pack_overhead_seconds=15, margin=1.15, ledger="results/gpu_depth/ledger.json",
                          fingerprint="results/gpu_depth/corpus_fingerprint.json")
MICRO_PIECE = PieceSettings(seconds=120, startup_seconds=30, reserve_seconds=5, mfu=0.02, min_step_seconds=0.001,
                            pack_overhead_seconds=10, margin=1.15)


@dataclasses.dataclass(frozen=True)
class Design:
    """One version of the experiment (full, or micro for tests).

    ``centres``: each pair's scout centre N (non-embedding parameters), keyed by its shallower depth; a pair
    is compared at ``centre · 2^ladder``. ``rate_check``: (rate at each depth's smallest width, rate at its
    largest), tried in stage 2 only, with its first seed. Stage 2 trains ``confirm_seeds`` on the same
    ladder around ``choose``'s centres.
    """

    name: str
    depths: tuple[int, ...]
    centres: dict
    ladder: tuple[float, ...]
    confirm_ladder: tuple[float, ...]
    rate_check: tuple[float, float]
    confirm_seeds: tuple[int, ...]
    tokens_per_param: float
    multiple_of: int
    base: TrainConfig
    piece: PieceSettings

    def __post_init__(self):
        pairs = set(zip(self.depths[:-1], self.depths[1:]))
        if set(self.centres) != {shallow for shallow, _ in pairs}:
            raise ValueError(f"centres keys {sorted(self.centres)} must be the shallower depths of the pairs "
                             f"{sorted(pairs)}")
        if len(self.ladder) < 2 or sorted(set(self.ladder)) != list(self.ladder):
            raise ValueError(f"ladder={self.ladder} must hold 2 or more increasing log2 offsets")

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.depths[:-1], self.depths[1:]))


def _transition_params(depth: int) -> float:
    """N_tr(L) from the paper's fit, in parameters."""
    from analysis.projection import FIT_PRESETS, transition_params

    return float(transition_params(depth, FIT_PRESETS["levine2020"]))


def full_design() -> Design:
    base = TrainConfig(
        model=ModelConfig(head_dim=16, max_seq_len=512, compute_dtype="bfloat16", param_dtype="float32",
                          attention_impl="flash"),  # cuDNN's fused kernel on a GPU; not part of the run ids
        data=data_config(seq_len=512),
        optim=OptimConfig(peak_lr=2e-3, lr_rule="constant", warmup_steps=100, schedule="cosine",
                          end_lr_fraction=0.1, weight_decay=0.1, grad_clip=1.0),
        steps=1000,  # replaced per run by tokens_per_param
        batch_size=32, eval_every=0, eval_batches=32, eval_at_start=False, checkpoint_every=1000,
        log_every=100, peak_flops=H100_BF16_PEAK, wandb_mode="offline")
    depths = (3, 6, 9, 12)
    return Design(name="gpu_depth", depths=depths, centres={d: _transition_params(d) for d in depths[:-1]},
                  ladder=LADDER, confirm_ladder=LADDER, rate_check=RATE_CHECK, confirm_seeds=(1, 2, 3, 4),
                  tokens_per_param=TOKENS_PER_PARAM, multiple_of=16, base=base, piece=GPU_PIECE)


def micro_design() -> Design:
    base = TrainConfig(
        model=ModelConfig(head_dim=8, max_seq_len=32),
        data=data_config(seq_len=32),
        optim=OptimConfig(peak_lr=1e-2, lr_rule="constant", warmup_steps=5, schedule="cosine"),
        steps=10, batch_size=8, eval_every=0, eval_batches=2, eval_at_start=False, checkpoint_every=1000,
        log_every=10, wandb_mode="disabled")
    return Design(name="gpu_depth_micro", depths=(1, 2), centres={1: 8e3}, ladder=(-1.0, 1.0, 7.0),
                  confirm_ladder=(-1.0, 1.0, 7.0), rate_check=(2e-2, 5e-3), confirm_seeds=(1, 2), tokens_per_param=4.0,
                  multiple_of=8, base=base, piece=MICRO_PIECE)


def design() -> Design:
    """The design the environment asks for: ``GPU_DEPTH_MICRO=1`` gives the micro version."""
    return micro_design() if os.environ.get("GPU_DEPTH_MICRO", "") not in ("", "0") else full_design()


def pair_widths(shallow: int, deep: int, sizes, multiple_of: int) -> tuple[list[int], list[int]]:
    """Widths of a pair compared at ``sizes`` (parameters): the shallower depth's nearest each size; the
    deeper depth's nearest the shallower's first and last realised sizes, moved outwards by ``multiple_of``
    while they leave the shallower's ends outside ``RANGE_TOLERANCE``, and one nearest the geometric mean of
    the sizes between (the analysis interpolates the deeper curve linearly in ln N between its points: over
    a √2 ladder's span the curvature of a power law costs well under a thousandth of a nat)."""
    low = [budget.width_for_budget(shallow, n, multiple_of) for n in sizes]
    realised = [budget.non_embedding_params(shallow, w) for w in low]
    first, last = (budget.width_for_budget(deep, n, multiple_of) for n in (realised[0], realised[-1]))
    while budget.non_embedding_params(deep, first) > realised[0] * (1 + RANGE_TOLERANCE) and first > multiple_of:
        first -= multiple_of
    while budget.non_embedding_params(deep, last) * (1 + RANGE_TOLERANCE) < realised[-1]:
        last += multiple_of
    inner = realised[1:-1]
    middle = [budget.width_for_budget(deep, float(np.exp(np.mean(np.log(inner)))), multiple_of)] if inner else []
    return low, sorted({first, *middle, last})


def design_widths(d: Design, centres: dict, ladder) -> dict[int, tuple[int, ...]]:
    """Widths per depth: the union of the widths of the pairs it belongs to, each compared at
    ``centre · 2^ladder`` (``centres`` by shallower depth)."""
    widths: dict[int, set] = {}
    for shallow, deep in d.pairs:
        sizes = [centres[shallow] * 2.0 ** k for k in ladder]
        low, high = pair_widths(shallow, deep, sizes, d.multiple_of)
        widths.setdefault(shallow, set()).update(low)
        widths.setdefault(deep, set()).update(high)
    return {depth: tuple(sorted(values)) for depth, values in sorted(widths.items())}


def _sweep(d: Design, name: str, widths: dict, seeds, rate_checks=()) -> PieceSweep:
    return PieceSweep(name=name, base=d.base, depths=tuple(widths), widths=widths, seeds=seeds,
                      multiple_of=d.multiple_of, tokens_per_param=d.tokens_per_param, pack=5,
                      expected_mfu=EXPECTED_MFU if d.base.peak_flops == H100_BF16_PEAK else None,
                      piece=d.piece, rate_checks=rate_checks)


def scout(design_: Design | None = None) -> PieceSweep:
    """Stage 1: seed 0 on each pair's ladder around the predicted transition."""
    d = design_ or design()
    return _sweep(d, d.name, design_widths(d, d.centres, d.ladder), (0,))


def confirmation(chosen: dict, design_: Design | None = None) -> PieceSweep:
    """Stage 2 from ``choose``'s output: every pair's ladder around its chosen centre, ``confirm_seeds`` each,
    and the rate check: the first seed again at ``rate_check``'s rates at each depth's smallest and largest width."""
    d = design_ or design()
    if chosen.get("design") != d.name:
        raise ValueError(f"the stage-2 sizes were chosen for design {chosen.get('design')!r}, not {d.name!r}")
    centres = {p["shallow_depth"]: p["centre_params"] for p in chosen["pairs"]}
    if set(centres) != set(d.centres):
        raise ValueError(f"the stage-2 sizes name the pairs of shallower depths {sorted(centres)}, not "
                         f"{sorted(d.centres)}")
    widths = design_widths(d, centres, d.confirm_ladder)
    checks = [(depth, w[0], d.rate_check[0]) for depth, w in widths.items()]
    checks += [(depth, w[-1], d.rate_check[1]) for depth, w in widths.items()]
    return _sweep(d, f"{d.name}_stage2", widths, d.confirm_seeds, checks)


def sweep() -> PieceSweep:
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
# Reading the records: stage 2's centres from the scout, the rate check from stage 2


def rate_check(records_dir, design_: Design | None = None) -> list[dict]:
    """The rate check of stage 2's records in ``records_dir``: per checked run, its loss beside the loss of the
    same seed and shape at the common rate (one data order: a paired comparison), and whether the checked
    rate beats the common one by more than ``RATE_TOLERANCE`` nats per token (the depth is then flagged)."""
    from analysis.results import load_runs

    d = design_ or design()
    runs = load_runs(str(records_dir)).runs
    common = d.base.optim.peak_lr
    at_common = {(r.depth, r.width, r.seed): r.loss for r in runs.itertuples() if np.isclose(r.peak_lr, common)}
    rows = []
    for run in runs.itertuples():
        partner = at_common.get((run.depth, run.width, run.seed))
        if np.isclose(run.peak_lr, common) or partner is None:
            continue
        rows.append({"depth": int(run.depth), "width": int(run.width), "seed": int(run.seed), "common_rate": common,
                     "checked_rate": float(run.peak_lr), "loss_common": float(partner), "loss_checked": float(run.loss),
                     "flagged": bool(partner - run.loss > RATE_TOLERANCE)})
    return sorted(rows, key=lambda row: (row["depth"], row["width"]))


def choose(scout_dir, design_: Design | None = None, loss_std: float = SCOUT_LOSS_STD) -> dict:
    """Stage 2's centres per pair from the scout's finished records in ``scout_dir`` (the common rate's runs).

    Each pair is centred on the zero crossing of its loss difference
    (``analysis.transition``, seed noise ``loss_std`` nats per token since the
    scout has one seed); without one, on the compared size where |difference| is
    smallest (the pair's transition lies at or beyond that end of the scout's
    range); without any compared size, on the predicted centre.
    """
    from analysis.results import load_runs
    from analysis.transition import find_transitions

    d = design_ or design()
    table = load_runs(str(scout_dir))
    common = table.runs[np.isclose(table.runs["peak_lr"], d.base.optim.peak_lr)]
    transitions, test = find_transitions(common, loss_std=loss_std, n_bootstrap=0)
    by_pair = {(t.shallow_depth, t.deep_depth): t for t in transitions}
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
                      "sizes": [float(centre * 2.0 ** k) for k in d.confirm_ladder]})
    return {"design": d.name, "scout": str(scout_dir), "loss_std": loss_std, "test": test,
            "scout_runs": int(len(common)), "pairs": pairs}


def _print_rate_check(rows: list[dict]) -> None:
    for row in rows:
        print(f"rate check L={row['depth']} d={row['width']} seed {row['seed']}: {row['checked_rate']:g} gives "
              f"{row['loss_checked']:.4f}, {row['common_rate']:g} gives {row['loss_common']:.4f}"
              + ("  FLAGGED" if row["flagged"] else ""))
    flagged = sorted({row["depth"] for row in rows if row["flagged"]})
    print(f"flagged depths: {', '.join(map(str, flagged)) if flagged else 'none'} (tolerance {RATE_TOLERANCE} nats)")


def main(argv=None) -> int:
    """``python -m sweeps.configs.gpu_depth choose SCOUT_DIR --out FILE`` or ``rate-check STAGE2_DIR``."""
    parser = argparse.ArgumentParser(prog="python -m sweeps.configs.gpu_depth",
                                     description="Choose stage 2's sizes from the scout's records; read stage 2's "
                                                 "rate check.")
    commands = parser.add_subparsers(dest="command", required=True)
    chooser = commands.add_parser("choose", help="write stage 2's sizes per pair (JSON) from the scout's records",
                                  description=choose.__doc__.split("\n\n")[1].strip())
    chooser.add_argument("scout_dir", help="the scout's sweep directory, e.g. results/gpu_depth/gpu_depth")
    chooser.add_argument("--out", required=True, type=pathlib.Path, help="JSON file to write")
    chooser.add_argument("--loss-std", type=float, default=SCOUT_LOSS_STD,
                         help=f"seed noise in nats per token for the one-seed scout (default {SCOUT_LOSS_STD})")
    checker = commands.add_parser("rate-check", help="stage 2's rate check: checked rates against 2e-3, flags",
                                  description=rate_check.__doc__.split("\n\n")[0].strip())
    checker.add_argument("stage2_dir", help="stage 2's sweep directory, e.g. results/gpu_depth/gpu_depth_stage2")
    args = parser.parse_args(argv)
    from analysis.errors import AnalysisInputError

    try:
        if args.command == "rate-check":
            _print_rate_check(rate_check(args.stage2_dir))
            return 0
        chosen = choose(args.scout_dir, loss_std=args.loss_std)
        confirmation(chosen)  # the sizes must make a valid sweep before they are written
    except (AnalysisInputError, ValueError) as error:
        print(f"{parser.prog} {args.command}: error: {error}", file=sys.stderr)
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
