"""Stage 0 of the CPU depth experiment: the peak learning rate per depth, at one mid-window size.

    python -m sweeps.launch run sweeps/configs/cpu_depth_lr.py --workdir results
    python -m analysis fit results/cpu_depth_lr     # or: launch status ... (loss per run)

Depths 2, 3, 4 and 6 at N = 12·L·d² ≈ 1.2e6 (widths 224, 176, 160, 128, the
middle of the window the main sweep covers), one seed, peak rates 1e-3,
2e-3 and 4e-3 under a constant rule (the same rate for every parameter).
A depth whose best rate lies at an end of the grid gets one more rate
beyond it before the choice is made: depths 2, 4 and 6 were best at 4e-3,
so each of them also has 8e-3. The best rate per depth, or one rate that is within noise of the
best at every depth, becomes the main sweep's choice; the README of
results/cpu_depth records which and why. Training setup: ``cpu_depth.base_config``.
"""

from sweeps.configs.cpu_depth import base_config
from sweeps.spec import Sweep

WIDTHS = {2: (224,), 3: (176,), 4: (160,), 6: (128,)}  # N = 12·L·d² of 1.20e6, 1.12e6, 1.23e6, 1.18e6
# 8e-3 was added for the depths that were best at 4e-3, the grid's upper end.
LEARNING_RATES = {2: (1e-3, 2e-3, 4e-3, 8e-3), 3: (1e-3, 2e-3, 4e-3), 4: (1e-3, 2e-3, 4e-3, 8e-3),
                  6: (1e-3, 2e-3, 4e-3, 8e-3)}


def sweep() -> Sweep:
    return Sweep(name="cpu_depth_lr", base=base_config(), depths=tuple(WIDTHS), widths=WIDTHS, seeds=(0,),
                 lr_grid=LEARNING_RATES, multiple_of=16)
