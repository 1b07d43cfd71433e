"""Train several runs of one shape together: one loop, one packed program, every run its own member.

(Filled in below.)
"""

from __future__ import annotations

import dataclasses

from scaling import optim as optim_lib, parametrization
from scaling.config import TrainConfig


def pack_key(config: TrainConfig):
    """What runs must share to train in one pack: ``config`` without the numbers a run hands its
    compiled step as arguments (seed, learning rates and schedule numbers; ``program.hyperparameters``)
    and without its name. Runs whose keys are equal have one program, one step count, one data source
    and one loop cadence (evaluation, checkpoints, logging); hashable."""
    return (dataclasses.replace(config, seed=0, name="", optim=optim_lib.without_numbers(config.optim)),
            parametrization.multipliers(config.optim, config.model))
