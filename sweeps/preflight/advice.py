"""What to change for a run the preflight checked: how to make it fit, and the cheapest remat policy that fits.

``suggest`` reads a run that does not fit (its state and temporaries per
chip) and names the change: more fsdp, remat, or a smaller per-chip batch.
``cheapest_remat`` goes the other way for a run that fits: rematerialising
costs a forward pass of recomputation per layer, so the cheapest policy is
the one that recomputes least and still fits (none < dots < full); it is
found by compiling the cheaper policies, each a full compile.
"""

from __future__ import annotations

import dataclasses
import math

from scaling.config import TrainConfig
from scaling.hardware import GIB
from scaling.model import mesh as mesh_lib

FIT_FRACTION = 0.95  # of a chip's HBM a run may plan to use (see sweeps/preflight/report.py)
REMAT_BY_COST = ("none", "dots", "full")  # least recomputation first


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Where one chip's HBM goes, in bytes: the state shard, the whole state, and the temporaries."""

    state_per_chip: int  # parameters + optimizer state + batch held by one chip
    state_total: int  # the same, unsharded
    temporaries: int | None  # activations and scratch the compiler plans (None: unknown)


def suggest(config: TrainConfig, mesh, footprint: Footprint, hbm_bytes: int) -> str:
    """What to change for a run that does not fit one chip's ``hbm_bytes``: more fsdp, remat, or a smaller batch.

    The larger of state and temporaries is addressed; both are when each
    alone overflows. State that fsdp should have sharded but did not (a width
    the fsdp axis does not divide stays whole on every chip) gets the fsdp
    size that does divide it.
    """
    state, temporaries = footprint.state_per_chip, footprint.temporaries
    devices, fsdp, tensor = mesh.devices.size, mesh.shape["fsdp"], mesh.shape["tensor"]
    width = config.model.width
    activations_dominate = temporaries is not None and temporaries > state
    fixes = []
    if state > FIT_FRACTION * hbm_bytes or not activations_dominate:
        dividing = math.gcd(width, devices // tensor)  # largest fsdp that divides the width and the chips
        what = f"parameters and optimizer state take {state / GIB:.1f} GiB per chip"
        if fsdp > 1 and state > 1.5 * footprint.state_total / fsdp:
            fixes.append(f"{what}, mostly unsharded: fsdp={fsdp} does not divide width {width}, so those "
                         f"dimensions stay whole; use mesh.fsdp={dividing} mesh.data={devices // tensor // dividing}"
                         f" or a width that is a multiple of {fsdp}")
        elif dividing > fsdp:
            fixes.append(f"{what}: shard them over more chips with mesh.fsdp={dividing} "
                         f"mesh.data={devices // tensor // dividing} (now fsdp={fsdp})")
        else:
            fixes.append(f"{what} with fsdp={fsdp}: use a larger slice")
    if activations_dominate:
        if config.model.remat == "none":
            fixes.append(f"activations take {temporaries / GIB:.1f} GiB per chip: recompute them in the "
                         f"backward pass with model.remat=full (or dots)")
        else:
            per_chip = config.batch_size / mesh_lib.batch_axes_size(mesh)
            fixes.append(f"activations take {temporaries / GIB:.1f} GiB per chip even with remat="
                         f"{config.model.remat}: lower the per-chip batch ({per_chip:g} sequences now; halve "
                         f"batch_size or use a larger slice)")
    return "; and ".join(fixes)


def cheapest_remat(config: TrainConfig, fits) -> dict | None:
    """The first policy of ``REMAT_BY_COST`` cheaper than ``config.model.remat`` for which ``fits(config)``
    (a compile) says the run fits: ``{"remat": policy, "row": its preflight row}``; None if none is cheaper.

    ``fits(candidate)`` returns a preflight row (with ``fits``). Policies are
    tried cheapest first, so the answer costs at most two extra compiles.
    """
    current = config.model.remat
    if current not in REMAT_BY_COST:
        return None
    for policy in REMAT_BY_COST[:REMAT_BY_COST.index(current)]:
        candidate = dataclasses.replace(config, model=dataclasses.replace(config.model, remat=policy))
        row = fits(candidate)
        if row.get("fits"):
            return {"remat": policy, "row": row}
    return None
