"""Which runs train together: a share's runs to train, grouped into packs of one shape.

A pack is up to ``pack`` runs that ``run`` trains as one compiled program
(``scaling.run.train.run_pack``): runs whose configs have equal
``scaling.model.run_program.pack_key`` (they differ only in seed and learning-rate
numbers) and that resume from the same step (their newest committed
checkpoint, 0 for none; ``sweeps.state.resume_step``), since a pack's
members take every step together. The queue's order (cheapest first) is
kept as far as packing allows: a pack sits where its first run was, and a
run joins the earliest pack of its kind that still has room.

Planning reads nothing from disk itself (the caller says where each run
would start) and, with ``pack`` 1, imports nothing heavy: ``list`` and
``status`` stay quick. Packs are labelled ``p1``, ``p2``... in plan order.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

from sweeps.spec import RunSpec


@dataclasses.dataclass(frozen=True)
class Pack:
    """Runs that train together as one program, in queue order, all resuming from ``start_step``.

    ``label``: ``p1``, ``p2``... by the pack's place in its plan (for display).
    """

    label: str
    runs: tuple[RunSpec, ...]
    start_step: int = 0

    def __post_init__(self):
        object.__setattr__(self, "runs", tuple(self.runs))
        if not self.runs or not all(isinstance(run, RunSpec) for run in self.runs):
            raise ValueError(f"runs={self.runs!r} is invalid: allowed a non-empty sequence of sweeps.spec.RunSpec")
        ids = [run.run_id for run in self.runs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"runs of pack {self.label}: a run is listed twice ({', '.join(ids)})")
        if not isinstance(self.start_step, int) or isinstance(self.start_step, bool) or self.start_step < 0:
            raise ValueError(f"start_step={self.start_step!r} is invalid: allowed an integer >= 0 (optimiser steps)")

    @property
    def names(self) -> list[str]:
        return [run.name for run in self.runs]

    def describe(self) -> dict:
        """JSON-ready: label, start step, run names."""
        return {"label": self.label, "start_step": self.start_step, "runs": self.names}


def plan_packs(runs: list[RunSpec], pack: int, start_step: Callable[[RunSpec], int],
               size_of: Callable[[RunSpec], int] | None = None) -> list[Pack]:
    """``runs`` (in the order they would train) grouped into packs of at most ``pack`` runs.

    Runs share a pack only when their ``pack_key`` and ``start_step(run)``
    (the optimiser step it would resume from) are equal. Each run joins the
    earliest pack of its kind with room, else opens a new one; packs are in
    the order of their first runs, and runs within a pack keep their order.
    With ``pack`` 1 every run is a pack of its own, in the order given.
    ``size_of(run)``: a pack size per run instead (the preflight's choice, at most ``pack``); runs of one
    kind and size share packs of that size.
    """
    if not isinstance(pack, int) or isinstance(pack, bool) or pack < 1:
        raise ValueError(f"pack={pack!r} is invalid: allowed an integer >= 1 (the most runs trained together)")
    size_of = size_of or (lambda run: pack)
    if pack == 1:  # no grouping to do: skip pack_key, which imports JAX
        groups = [[run] for run in runs]
        steps = [start_step(run) for run in runs]
    else:
        from scaling.model.run_program import pack_key

        groups, steps, open_group = [], [], {}  # open_group: (key, step) -> index of its pack with room
        for run in runs:
            step, size = start_step(run), min(size_of(run), pack)
            kind = (pack_key(run.config), step, size)
            index = open_group.get(kind)
            if index is None:
                index = open_group[kind] = len(groups)
                groups.append([])
                steps.append(step)
            groups[index].append(run)
            if len(groups[index]) == size:
                del open_group[kind]
    return [Pack(f"p{i + 1}", tuple(group), step) for i, (group, step) in enumerate(zip(groups, steps))]


def labels(packs: list[Pack]) -> dict[str, str]:
    """Run id -> the label of the pack it is in."""
    return {run.run_id: pack.label for pack in packs for run in pack.runs}


def plan_line(packs: list[Pack], pack: int) -> str:
    """One line for dry-run and run: how many packs of at most ``pack`` runs, how many runs each holds, and
    the packs that resume (e.g. ``7 runs in 3 packs of up to 3: 2 × 3 runs, 1 × 1 run; resuming: p2 at step 20``)."""
    sizes = collections.Counter(len(p.runs) for p in packs)
    total = sum(len(p.runs) for p in packs)
    text = (f"{total} run{'s' if total != 1 else ''} in {len(packs)} pack{'s' if len(packs) != 1 else ''} "
            f"of up to {pack}"
            + "".join(f"{', ' if i else ': '}{n} × {size} run{'s' if size > 1 else ''}"
                      for i, (size, n) in enumerate(sorted(sizes.items(), reverse=True))))
    resumed = [f"{p.label} at step {p.start_step}" for p in packs if p.start_step]
    return text + (f"; resuming: {', '.join(resumed)}" if resumed else "")
