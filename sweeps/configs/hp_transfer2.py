"""Learning-rate transfer you can trust: base settings tuned at the base shape, then transfer over width and depth.

    nohup python -m sweeps.launch run sweeps/configs/hp_transfer2.py --workdir results > hp_transfer2.log 2>&1 &
    python -m sweeps.launch status sweeps/configs/hp_transfer2.py --workdir results
    python -m analysis hp-transfer2 results/hp_transfer2 --decisions > results/hp_transfer2/decisions.json

``results/hp_transfer2/README.md`` pre-registers the design, the budget and the criterion. In stages,
every stage's runs one pack per shape and parametrization (``pack``), resumable:

1. base tuning at the base shape (depth 2, width 64, two heads of 32 channels): output multiplier
   0.5, 1, 2, 4 × readout start normal or zero × 5 rates on a √2 lattice × 3 seeds (120 runs);
2. once ``results/hp_transfer2/decisions.json`` holds stage 1's choice (written by the analysis, by
   the pre-registered rule): widths 128, 256, 512 at depth 2 under standard and μP, depths 4, 8, 16 at
   width 64 under standard and CompleteP, 5 rates × 3 seeds each, centred where each optimum is
   expected (180 runs); the base shape's curve is stage 1's at the chosen setting;
3. once the decisions hold ``extensions``: 2 more rates for each shape whose optimum stage 2 did not
   locate, once.

Heads: two at every width, so the head size grows from 32 (width 64) to 256 and μP's attention rule
(1/d_head) acts. Rules as the references give them (``scaling/model/parametrization.py``): epsilon of
the residual blocks scaled (``eps_rule=blocks``), μP's hidden weight decay × width/64, output
projections without GPT-2's depth factor under μP, base epsilon 1e-12.
"""

import json
import pathlib

from analysis import hp_transfer2 as design
from scaling.config import DataConfig, ModelConfig, OptimConfig, TrainConfig
from sweeps.spec import Sweep, Variant

STEPS, BATCH, SEQ_LEN = 600, 16, 64
EVAL_BATCHES = 76
DECISIONS = pathlib.Path(__file__).resolve().parents[2] / "results" / "hp_transfer2" / "decisions.json"
PACK = len(design.SPAN) * len(design.SEEDS)  # one shape's rates and seeds: one compiled program


def base_config() -> TrainConfig:
    """The setup every run shares; shape, rate, parametrization and the base settings vary."""
    return TrainConfig(
        model=ModelConfig(num_heads=2, max_seq_len=SEQ_LEN, position="rope"),
        data=DataConfig(source="builtin", seq_len=SEQ_LEN),
        optim=OptimConfig(peak_lr=1e-2, base_width=design.BASE_WIDTH, base_depth=design.BASE_DEPTH,
                          warmup_steps=STEPS // 10, schedule="cosine", end_lr_fraction=0.1, weight_decay=0.1,
                          grad_clip=1.0, eps=1e-12, eps_rule="blocks", mup_weight_decay="width", mup_out_init="base"),
        steps=STEPS, batch_size=BATCH, eval_every=0, eval_batches=EVAL_BATCHES, eval_at_start=False,
        checkpoint_every=100, keep_checkpoints=1, log_every=10, wandb_mode="offline")


def _settings(multiplier: float, zero_readout: bool) -> tuple[str, ...]:
    return (f"optim.output_multiplier={multiplier}", f"optim.zero_init_readout={str(zero_readout).lower()}")


def stage1() -> list[Variant]:
    """Base tuning at the base shape, under μP (at the base shape every parametrization is this model)."""
    rates = tuple(design.lattice_rate(k) for k in design.BASE_STEPS)
    return [Variant(design.base_tag(multiplier, init), ("optim.parametrization=mup",) + _settings(multiplier,
                    init == "zero"), shapes=((design.BASE_DEPTH, design.BASE_WIDTH),), lr_grid=rates)
            for multiplier in design.BASE_MULTIPLIERS for init in design.READOUT_INITS]


def _shape(axis: str, size: int) -> tuple[int, int]:
    return (design.BASE_DEPTH, size) if axis == "width" else (size, design.BASE_WIDTH)


def stage2(base: dict, extensions: list[dict] | None) -> list[Variant]:
    """The transfer runs at the chosen base settings, and the grid's one extension where decided."""
    settings = _settings(base["output_multiplier"], base["zero_init_readout"])
    variants = []
    for axis, names in design.COMPARED.items():
        for name in names:
            for size in (design.WIDTHS if axis == "width" else design.DEPTHS)[1:]:
                indices = design.stage2_indices(base["base_index"], name, axis, size)
                rates = tuple(design.lattice_rate(k) for k in indices)
                variants.append(Variant(design.shape_tag(name, axis, size), (f"optim.parametrization={name}",)
                                        + settings, shapes=(_shape(axis, size),), lr_grid=rates))
    for added in extensions or ():
        name, axis, size = added["parametrization"], added["axis"], added["size"]
        variants.append(Variant(design.shape_tag(name, axis, size, extension=True),
                                (f"optim.parametrization={name}",) + settings, shapes=(_shape(axis, size),),
                                lr_grid=tuple(design.lattice_rate(k) for k in added["indices"])))
    return variants


def sweep() -> Sweep:
    decisions = json.loads(DECISIONS.read_text()) if DECISIONS.is_file() else {}
    variants = stage1()
    if decisions.get("base"):
        variants += stage2(decisions["base"], decisions.get("extensions"))
    widths = {design.BASE_DEPTH: design.WIDTHS, **{depth: (design.BASE_WIDTH,) for depth in design.DEPTHS[1:]}}
    return Sweep(name="hp_transfer2", base=base_config(), depths=design.DEPTHS, widths=widths, seeds=design.SEEDS,
                 multiple_of=32, variants=tuple(variants), pack=PACK)
