"""Follow-up to the second transfer experiment: the base shape on a lower grid (exploratory).

    python -m sweeps.launch run sweeps/configs/hp_transfer2_base_followup.py --workdir results
    python -m analysis hp-transfer2 results/hp_transfer2 \
        --base-extension results/hp_transfer2_base_extension results/hp_transfer2_base_followup

``results/hp_transfer2/README.md`` (section "Follow-up") registers it, after the experiment ended, and
says why: every registered verdict waits on the base shape alone (width 64, depth 2, stage 1's chosen
setting: output multiplier 4, readout started normal), whose loss still falls at the lowest rate tried
(2.5e-3, by the exploratory extension). This sweep continues the same lattice down by 4 rates (indices
-5 to -8 of the lattice through 1e-2: 1.77e-3, 1.25e-3, 8.84e-4, 6.25e-4), 3 seeds, as one pack. Every
other setting is stage 1's; the records go to ``results/hp_transfer2_base_followup/``.
"""

from analysis import hp_transfer2 as design
from sweeps.configs import hp_transfer2
from sweeps.spec import Sweep, Variant

CHOSEN = (4.0, "normal")  # stage 1's choice (results/hp_transfer2/decisions.json: output multiplier, readout)
INDICES = (-5, -6, -7, -8)  # below the exploratory extension's lowest rate (index -4, 2.5e-3)


def sweep() -> Sweep:
    multiplier, init = CHOSEN
    variant = Variant(design.base_tag(multiplier, init) + "-x",
                      ("optim.parametrization=mup",) + hp_transfer2._settings(multiplier, init == "zero"),
                      shapes=((design.BASE_DEPTH, design.BASE_WIDTH),),
                      lr_grid=tuple(design.lattice_rate(k) for k in INDICES))
    return Sweep(name="hp_transfer2_base_followup", base=hp_transfer2.base_config(), depths=(design.BASE_DEPTH,),
                 widths={design.BASE_DEPTH: (design.BASE_WIDTH,)}, seeds=design.SEEDS, multiple_of=32,
                 variants=(variant,), pack=len(INDICES) * len(design.SEEDS))
