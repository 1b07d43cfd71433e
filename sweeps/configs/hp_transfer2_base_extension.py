"""Exploratory addition to the second transfer experiment: the base shape's curve extended downward.

    python -m sweeps.launch run sweeps/configs/hp_transfer2_base_extension.py --workdir results
    python -m analysis hp-transfer2 results/hp_transfer2 --base-extension results/hp_transfer2_base_extension

``results/hp_transfer2/README.md`` (section "Exploratory addition") registers it and says why: stage 1's
curve at the chosen setting (output multiplier 4, readout started normal) is lowest at its grid's low end
and opens downward, so its optimum is not located, and the registered stage 3 extends only stage 2's
shapes. This sweep gives it the extension the stage-3 rule gives an unresolved shape: 2 lattice rates
beyond the end with the lower mean loss (indices -3 and -4 of the lattice through 1e-2: 3.54e-3, 2.5e-3),
3 seeds, as one pack. Every other setting is stage 1's (``hp_transfer2.base_config`` and its settings);
the records go to ``results/hp_transfer2_base_extension/``, so the registered experiment's are untouched.
"""

from analysis import hp_transfer2 as design
from sweeps.configs import hp_transfer2
from sweeps.spec import Sweep, Variant

CHOSEN = (4.0, "normal")  # stage 1's choice (results/hp_transfer2/decisions.json: output multiplier, readout)
INDICES = (-3, -4)  # the two lattice rates beyond the lower-loss end (5e-3, index -2) of stage 1's grid


def sweep() -> Sweep:
    multiplier, init = CHOSEN
    variant = Variant(design.base_tag(multiplier, init) + "-x",
                      ("optim.parametrization=mup",) + hp_transfer2._settings(multiplier, init == "zero"),
                      shapes=((design.BASE_DEPTH, design.BASE_WIDTH),),
                      lr_grid=tuple(design.lattice_rate(k) for k in INDICES))
    return Sweep(name="hp_transfer2_base_extension", base=hp_transfer2.base_config(), depths=(design.BASE_DEPTH,),
                 widths={design.BASE_DEPTH: (design.BASE_WIDTH,)}, seeds=design.SEEDS, multiple_of=32,
                 variants=(variant,), pack=len(INDICES) * len(design.SEEDS))
