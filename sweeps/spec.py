"""A sweep: depths × (parameter budgets or widths) × seeds (× learning rates), expanded into runs.

A sweep file is a Python file that defines ``sweep() -> Sweep`` (or a module
level ``SWEEP``); its docstring holds the command that runs it. Expanding a
sweep is pure bookkeeping: it never builds the data pipeline or touches a
device, so a pod-sized sweep lists instantly on a laptop.

Each run is a ``RunSpec``:
- ``name``: readable, ``L12-d768-s0`` (``-lr3e-03`` appended when the sweep
  has a learning-rate grid);
- ``run_id``: ``scaling.config.config_id`` of the resolved ``TrainConfig``, a
  hash of everything that changes the trained model. Changing steps, data or
  optimizer gives new run ids, so stale results are never mistaken for new
  ones; changing presentation fields (wandb, logging, checkpoint cadence,
  mesh) keeps them;
- its run directory ``<workdir>/<sweep name>/<run_id>/``, which is exactly
  what ``scaling.run.train.run`` writes into.

Widths come from ``scaling.model.budget.grid`` (width = sqrt(N / 12L) rounded to a
multiple of ``multiple_of``). A budget too small for a depth, or one that
rounds to a width an earlier budget already gave, is listed in
``Expansion.skipped`` rather than raised.

Many hosts split a sweep with ``shard``; which share a host takes, and how
its JAX is confined to its own devices, is decided in ``sweeps.hosts``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import math
import re
from typing import Literal, NamedTuple

import numpy as np

from scaling import python_file
from scaling.config import TrainConfig, config_id, to_dict
from scaling.overrides import override
from scaling.model import budget
from scaling.model.flops import training_flops_per_token

_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PARALLELISM = ("pinned", "auto")  # Sweep.parallelism: the config's mesh, or the preflight's choice
# Fields the grid sets on every run; --set may not change them.
GRID_FIELDS = ("model.depth", "model.width", "seed", "name", "sweep_name")


SweepFileError = python_file.PythonFileError  # a sweep file that cannot be loaded: one line naming it


def lr_tag(lr: float) -> str:
    """Shortest scientific form of a learning rate that keeps its digits: 3e-03, 3.5e-03, 1e+09."""
    return np.format_float_scientific(lr, trim="-", exp_digits=2)


def training_flops(config: TrainConfig) -> float:
    """Training cost of ``config`` in FLOPs: ``scaling.model.flops.training_flops_per_token`` (forward +
    backward, unembedding and attention included) times the tokens of all steps.
    Evaluation and compilation are not counted.
    """
    return training_flops_per_token(config.model, config.data.seq_len).total * config.steps * config.tokens_per_step


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One training run of a sweep: a resolved config, its stable id and readable name.

    ``budget`` is the parameter budget (non-embedding N) the width was solved
    for, or None when the sweep gives explicit widths.
    """

    name: str
    run_id: str
    config: TrainConfig
    budget: float | None = None

    @property
    def depth(self) -> int:
        return self.config.model.depth

    @property
    def width(self) -> int:
        return self.config.model.width

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def params(self) -> int:
        """Non-embedding size N = 12·L·d² in parameters."""
        return budget.non_embedding_params(self.depth, self.width)

    @property
    def tokens(self) -> int:
        """Training tokens: steps × tokens per step."""
        return self.config.steps * self.config.tokens_per_step

    @property
    def flops(self) -> float:
        return training_flops(self.config)

    def run_dir(self, workdir):
        """``<workdir>/<sweep name>/<run_id>`` as an ``etils.epath.Path`` (local or gs://)."""
        from etils import epath

        return epath.Path(workdir) / self.config.sweep_name / self.run_id

    def describe(self) -> dict:
        """JSON-ready identity and shape of the run (parameters, tokens)."""
        return {"name": self.name, "run_id": self.run_id, "depth": self.depth, "width": self.width,
                "params": self.params, "budget": self.budget, "seed": self.seed,
                "peak_lr": self.config.optim.peak_lr, "tokens": self.tokens}


@dataclasses.dataclass(frozen=True)
class Variant:
    """A named change to a sweep's base config, crossed with the rest of the grid.

    ``tag`` starts each run name (``first-n10-log_length-L2-d16-s0``);
    ``overrides`` are ``key=value`` strings as ``--set`` takes them (never a
    grid field); ``seeds``, when given, replace the sweep's seeds for this
    variant (e.g. fewer seeds for a costlier task); ``shapes``, when given,
    are the (depth, width) pairs of the sweep's grid this variant runs at (the
    others it skips); ``lr_grid``, when given, replaces the sweep's rates for
    this variant (a grid centred on where this variant's optimum is expected).
    """

    tag: str
    overrides: tuple[str, ...] = ()
    seeds: tuple[int, ...] | None = None
    shapes: tuple[tuple[int, int], ...] | None = None
    lr_grid: tuple[float, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.tag, str) or not _NAME_PATTERN.match(self.tag):
            raise ValueError(f"variant tag={self.tag!r} is invalid: allowed letters, digits, '.', '_' and '-'")
        object.__setattr__(self, "overrides", tuple(self.overrides))
        for assignment in self.overrides:
            if assignment.split("=", 1)[0] in GRID_FIELDS:
                raise ValueError(f"variant {self.tag}: {assignment} sets a grid field ({', '.join(GRID_FIELDS)})")
        if self.seeds is not None:
            object.__setattr__(self, "seeds", _ints(self.seeds, f"variant {self.tag} seeds"))
        if self.shapes is not None:
            shapes = tuple(_ints(shape, f"variant {self.tag} shapes") for shape in self.shapes)
            if not shapes or any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
                raise ValueError(f"variant {self.tag}: shapes={self.shapes!r} is invalid: allowed (depth, width) pairs")
            object.__setattr__(self, "shapes", shapes)
        if self.lr_grid is not None:
            object.__setattr__(self, "lr_grid", _positive_floats(self.lr_grid, f"variant {self.tag} lr_grid"))

    def to_dict(self) -> dict:
        described = {"tag": self.tag, "overrides": list(self.overrides),
                     "seeds": None if self.seeds is None else list(self.seeds)}
        if self.shapes is not None:  # only when used, so the digests of other sweeps stay as they were
            described["shapes"] = [list(shape) for shape in self.shapes]
        if self.lr_grid is not None:  # likewise
            described["lr_grid"] = list(self.lr_grid)
        return described


class Skipped(NamedTuple):
    """A (depth, budget) pair that gave no run, and why."""

    depth: int
    budget: float
    reason: str


class Expansion(NamedTuple):
    runs: list[RunSpec]
    skipped: list[Skipped]


def _ints(values, field: str) -> tuple[int, ...]:
    values = tuple(values)
    if not values or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{field}={values!r} is invalid: allowed a non-empty sequence of integers")
    if len(set(values)) != len(values):
        raise ValueError(f"{field}={values!r} is invalid: values must be distinct")
    return tuple(int(v) for v in values)


def _positive_floats(values, field: str) -> tuple[float, ...]:
    values = tuple(float(v) for v in values)
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{field}={values!r} is invalid: allowed a non-empty sequence of positive numbers")
    if len(set(values)) != len(values):
        raise ValueError(f"{field}={values!r} is invalid: values must be distinct")
    return values


def _listed(grid: tuple | dict) -> list | dict:  # as JSON: a list, or a dict depth (a string) -> list
    return {str(k): list(v) for k, v in grid.items()} if isinstance(grid, dict) else list(grid)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A grid of training runs sharing one base config.

    - ``depths``: layer counts L.
    - ``budgets``: non-embedding sizes N = 12·L·d² (parameters), the same for
      every depth (a sequence) or per depth (a dict depth -> sequence);
      widths are solved per depth. Give either ``budgets`` or ``widths``.
    - ``widths``: explicit widths per depth (dict depth -> sequence, channels).
    - ``seeds``: one run per seed (initialisation and data order).
    - ``lr_grid``: optional ``optim.peak_lr`` values, one run per value per shape;
      the same for every depth (a sequence) or per depth (a dict depth ->
      sequence), for a grid centred on each depth's own optimum.
    - ``peak_lr_by_depth``: optional dict depth -> ``optim.peak_lr``, for a
      rate calibrated per depth (cannot be combined with ``lr_grid``).
    - ``multiple_of``: width rounding in channels; keep it a multiple of
      ``base.model.head_dim`` so every width splits into whole heads.
    - ``variants``: optional ``Variant``s (tasks, arms), each crossed with
      every shape and learning rate; a run per variant per seed.
    - ``tokens_per_param``: optional training tokens per non-embedding
      parameter; each run then trains round(tokens_per_param·12·L·d² /
      (batch_size·seq_len)) steps (at least 1) instead of ``base.steps``, so
      a size's training length grows with it, as in a compute-optimal ladder.
    - ``expected_mfu``: optional (low, high) model FLOP utilisation, as fractions
      of ``base.peak_flops``, that ``dry-run`` quotes its time at (both ends)
      before any run of the sweep has finished, instead of the launcher's guess.
    - ``pack``: the most runs of one shape (equal ``scaling.model.run_program.pack_key``;
      they differ only in seed and learning-rate numbers) that ``run`` trains
      together as one compiled program (``sweeps.packing``); 1, the default,
      trains every run alone. ``--pack`` overrides it for one launch.
    - ``parallelism``: ``pinned`` (default): every run trains on its config's
      mesh; ``auto``: the preflight compares the ways of spreading each run over
      the chips and ``run`` trains each run in the one its newest kept estimate
      chose (``sweeps.preflight.parallelism``; the mesh is no part of the run id).
    - ``data_parallel_state_bytes``: optional; runs whose training state
      (``scaling.model.budget.training_state_bytes``: parameters, gradients, AdamW's
      moments) is at most this many bytes get a data-parallel mesh (data=-1,
      fsdp=1, tensor=1; parameters replicated), the others keep ``base.mesh``.
    Validated on construction: a bad sweep fails before anything runs.
    """

    name: str
    base: TrainConfig
    depths: tuple[int, ...]
    budgets: tuple[float, ...] | dict = ()
    widths: dict | None = None
    seeds: tuple[int, ...] = (0,)
    lr_grid: tuple[float, ...] | dict = ()
    multiple_of: int = 64
    peak_lr_by_depth: dict | None = None
    variants: tuple[Variant, ...] = ()
    tokens_per_param: float | None = None
    expected_mfu: tuple[float, float] | None = None
    pack: int = 1
    parallelism: Literal["pinned", "auto"] = "pinned"
    data_parallel_state_bytes: int | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME_PATTERN.match(self.name):
            raise ValueError(f"name={self.name!r} is invalid: allowed letters, digits, '.', '_' and '-' "
                             "(it names the sweep's directory and wandb group)")
        if not isinstance(self.base, TrainConfig):
            raise ValueError(f"base={type(self.base).__name__} is invalid: allowed a scaling.config.TrainConfig")
        set_ = lambda field, value: object.__setattr__(self, field, value)  # noqa: E731 - frozen dataclass
        set_("depths", _ints(self.depths, "depths"))
        if min(self.depths) < 1:
            raise ValueError(f"depths={self.depths!r} is invalid: allowed integers >= 1")
        if bool(self.budgets) == bool(self.widths):
            raise ValueError("give exactly one of budgets (parameters; widths solved per depth) "
                             "or widths (dict depth -> widths)")
        set_("budgets", self._grid(self.budgets, "budgets", _positive_floats))
        if self.widths:
            set_("widths", self._per_depth(self.widths, "widths", _ints))
            if min(min(w) for w in self.widths.values()) < 1:
                raise ValueError(f"widths={self.widths!r} is invalid: allowed integers >= 1")
        set_("seeds", _ints(self.seeds, "seeds"))
        if min(self.seeds) < 0:
            raise ValueError(f"seeds={self.seeds!r} is invalid: allowed integers >= 0")
        set_("lr_grid", self._grid(self.lr_grid, "lr_grid", _positive_floats))
        if self.peak_lr_by_depth:
            if self.lr_grid:
                raise ValueError("give at most one of lr_grid (every rate for every shape) and peak_lr_by_depth")
            set_("peak_lr_by_depth", self._per_depth(
                self.peak_lr_by_depth, "peak_lr_by_depth", lambda value, field: _positive_floats((value,), field)[0]))
        else:
            set_("peak_lr_by_depth", None)
        if not isinstance(self.multiple_of, int) or self.multiple_of < 1:
            raise ValueError(f"multiple_of={self.multiple_of!r} is invalid: allowed an integer >= 1")
        set_("variants", tuple(self.variants))
        if not all(isinstance(v, Variant) for v in self.variants):
            raise ValueError("variants is invalid: allowed a sequence of sweeps.spec.Variant")
        if len({v.tag for v in self.variants}) != len(self.variants):
            raise ValueError(f"variants: tags {[v.tag for v in self.variants]} must be distinct")
        if self.tokens_per_param is not None:
            if not (isinstance(self.tokens_per_param, (int, float)) and math.isfinite(self.tokens_per_param)
                    and self.tokens_per_param > 0):
                raise ValueError(f"tokens_per_param={self.tokens_per_param!r} is invalid: allowed a positive number")
            set_("tokens_per_param", float(self.tokens_per_param))
        if self.expected_mfu is not None:
            mfu = tuple(self.expected_mfu) if isinstance(self.expected_mfu, (tuple, list)) else ()
            if not (len(mfu) == 2 and all(isinstance(v, (int, float)) for v in mfu) and 0 < mfu[0] <= mfu[1] <= 1):
                raise ValueError(f"expected_mfu={self.expected_mfu!r} is invalid: allowed (low, high) with "
                                 "0 < low <= high <= 1")
            set_("expected_mfu", (float(mfu[0]), float(mfu[1])))
        if not isinstance(self.pack, (int, np.integer)) or isinstance(self.pack, bool) or self.pack < 1:
            raise ValueError(f"pack={self.pack!r} is invalid: allowed an integer >= 1 (the most runs of one shape "
                             "trained together; 1 trains every run alone)")
        set_("pack", int(self.pack))
        if self.parallelism not in PARALLELISM:
            raise ValueError(f"parallelism={self.parallelism!r} is invalid: allowed one of {', '.join(PARALLELISM)}")
        if self.data_parallel_state_bytes is not None and not (
                isinstance(self.data_parallel_state_bytes, int) and self.data_parallel_state_bytes >= 1):
            raise ValueError(f"data_parallel_state_bytes={self.data_parallel_state_bytes!r} is invalid: allowed an "
                             "integer >= 1 (bytes) or None")
        grid = {(depth, width) for depth, width, _ in self._shapes()[0]}
        for variant in self.variants:
            if set(variant.shapes or ()) - grid:
                raise ValueError(f"variant {variant.tag}: shapes {sorted(set(variant.shapes) - grid)} are not in the "
                                 "sweep's grid of depths and widths")
        self.expand()  # every run's config validates now, not when it is reached

    def _grid(self, values, field: str, parse) -> tuple | dict:
        """``values`` parsed: one sequence for every depth, or a dict depth -> sequence; () when empty."""
        if isinstance(values, dict):
            return self._per_depth(values, field, parse)
        return parse(values, field) if values else ()

    def _per_depth(self, mapping: dict, field: str, parse) -> dict:
        if set(mapping) != set(self.depths):
            raise ValueError(f"{field} keys {sorted(mapping)} must be exactly the depths {sorted(self.depths)}")
        return {int(depth): parse(mapping[depth], f"{field}[{depth}]") for depth in self.depths}

    def _shapes(self) -> tuple[list[tuple[int, int, float | None]], list[Skipped]]:
        if self.widths:
            return [(depth, width, None) for depth in self.depths for width in self.widths[depth]], []
        shapes, skipped = [], []
        for depth in self.depths:
            budgets = self.budgets[depth] if isinstance(self.budgets, dict) else self.budgets
            points = budget.grid([depth], budgets, self.multiple_of)
            skipped += [Skipped(d, b, reason) for d, b, reason in points.skipped]
            used = {p.budget for p in points} | {s.budget for s in skipped if s.depth == depth}
            by_width = {p.width: p.budget for p in points}
            for leftover in sorted(set(budgets) - used):
                width = budget.width_for_budget(depth, leftover, self.multiple_of)
                skipped.append(Skipped(depth, leftover, f"rounds to width {width}, already given by budget "
                                                        f"{by_width[width]:.3g}"))
            shapes += [(p.depth, p.width, p.budget) for p in points]
        return shapes, skipped

    def expand(self) -> Expansion:
        """All runs (ordered by depth, width, learning rate, seed) and the budgets that gave none."""
        shapes, skipped = self._shapes()
        runs = []
        for depth, width, point_budget in shapes:
            for variant in self.variants or (None,):
                if variant is not None and variant.shapes is not None and (depth, width) not in variant.shapes:
                    continue
                seeds = self.seeds if variant is None or variant.seeds is None else variant.seeds
                rates = self.lr_grid[depth] if isinstance(self.lr_grid, dict) else self.lr_grid
                if variant is not None and variant.lr_grid is not None:
                    rates = variant.lr_grid
                for lr in rates or (None,):
                    for seed in seeds:
                        runs.append(self._run(depth, width, seed, lr, point_budget, variant))
        names = [run.name for run in runs]
        if len(set(names)) != len(names):
            raise ValueError(f"sweep {self.name}: two runs share a name; are widths or lr_grid values repeated?")
        return Expansion(runs, skipped)

    def _run(self, depth, width, seed, lr, point_budget, variant=None) -> RunSpec:
        name = f"L{depth}-d{width}-s{seed}" + (f"-lr{lr_tag(lr)}" if lr is not None else "")
        base = self.base
        try:
            if variant is not None:
                name = f"{variant.tag}-{name}"
                base = override(base, list(variant.overrides))
            if lr is None and self.peak_lr_by_depth:
                lr = self.peak_lr_by_depth[depth]
            optim = base.optim if lr is None else dataclasses.replace(base.optim, peak_lr=lr)
            steps = base.steps if self.tokens_per_param is None else self.steps_for(depth, width, base)
            config = dataclasses.replace(base, model=dataclasses.replace(base.model, depth=depth, width=width),
                                         optim=optim, seed=seed, sweep_name=self.name, name=name, steps=steps)
            if self.data_parallel_state_bytes and budget.training_state_bytes(config.model) <= \
                    self.data_parallel_state_bytes:  # the mesh is no part of the run id
                config = dataclasses.replace(config, mesh=dataclasses.replace(config.mesh, data=-1, fsdp=1, tensor=1))
        except ValueError as error:
            raise ValueError(f"sweep {self.name}, run {name}: {error}") from None
        return RunSpec(name=name, run_id=config_id(config), config=config, budget=point_budget)

    def steps_for(self, depth: int, width: int, base: TrainConfig | None = None) -> int:
        """Optimiser steps of shape (depth, width) under ``tokens_per_param``: tokens_per_param·12·L·d²
        tokens in steps of batch_size·seq_len tokens, rounded, at least 1."""
        base = base or self.base
        tokens = self.tokens_per_param * budget.non_embedding_params(depth, width)
        return max(1, round(tokens / base.tokens_per_step))

    def to_dict(self) -> dict:
        """JSON-ready description: the base config, the grid, and the runs it gives."""
        runs, skipped = self.expand()
        described = {"name": self.name, "base": to_dict(self.base), "depths": list(self.depths),
                "budgets": _listed(self.budgets), "widths": _listed(self.widths) if self.widths else None,
                "seeds": list(self.seeds), "lr_grid": _listed(self.lr_grid),
                "multiple_of": self.multiple_of,
                # only when used, so sweeps without variants keep their digest
                **({"variants": [v.to_dict() for v in self.variants]} if self.variants else {}),
                "runs": [{"name": run.name, "run_id": run.run_id} for run in runs],
                "skipped": [skip._asdict() for skip in skipped]}
        if self.peak_lr_by_depth:  # only when used, so the descriptions of other sweeps stay as they were
            described["peak_lr_by_depth"] = {str(k): v for k, v in self.peak_lr_by_depth.items()}
        if self.tokens_per_param is not None:  # likewise
            described["tokens_per_param"] = self.tokens_per_param
        if self.expected_mfu is not None:
            described["expected_mfu"] = list(self.expected_mfu)
        if self.pack != 1:  # likewise: sweeps that train every run alone keep their digest
            described["pack"] = self.pack
        if self.parallelism != "pinned":  # likewise
            described["parallelism"] = self.parallelism
        if self.data_parallel_state_bytes is not None:
            described["data_parallel_state_bytes"] = self.data_parallel_state_bytes
        return described

    def digest(self) -> str:
        """A short stable hash of ``to_dict()`` (12 hex characters)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def with_overrides(sweep: Sweep, assignments: list[str]) -> Sweep:
    """The sweep with ``key=value`` overrides applied to its base config (``--set``)."""
    if not assignments:
        return sweep
    for assignment in assignments:
        key = assignment.split("=", 1)[0]
        if key in GRID_FIELDS or (key == "optim.peak_lr" and (sweep.lr_grid or sweep.peak_lr_by_depth)) or (
                key == "steps" and sweep.tokens_per_param is not None):
            raise ValueError(f"--set {assignment}: {key} is set per run by the sweep grid; edit the sweep file")
    return dataclasses.replace(sweep, base=override(sweep.base, assignments))


def select(runs: list[RunSpec], globs: list[str] | None) -> list[RunSpec]:
    """The runs whose name matches one of the shell patterns ``globs`` (``--only``; all runs if none given).

    Raises ``ValueError`` (one line) when no run matches.
    """
    if not globs:
        return runs
    chosen = [run for run in runs if any(fnmatch.fnmatchcase(run.name, glob) for glob in globs)]
    if not chosen:
        raise ValueError(f"--only {' '.join(globs)}: matches none of the {len(runs)} run names "
                         "(see `python -m sweeps.launch list`)")
    return chosen


def shard(runs: list[RunSpec], index: int, count: int) -> list[RunSpec]:
    """Share ``index`` of ``count`` of ``runs``: disjoint, together complete, balanced in rough cost.

    Runs are dealt longest first (by ``training_flops``, ties by run id) to
    the share with the least work so far. The result depends only on the
    runs, never on which have finished, so every host computes the same
    split however often it restarts. Returned in the order of ``runs``.
    """
    if not (isinstance(count, int) and count >= 1 and isinstance(index, int) and 0 <= index < count):
        raise ValueError(f"shard {index}/{count} is invalid: allowed I/N with 0 <= I < N")
    loads, mine = [0.0] * count, set()
    for run in sorted(runs, key=lambda r: (-r.flops, r.run_id)):
        target = min(range(count), key=lambda k: (loads[k], k))
        loads[target] += run.flops
        if target == index:
            mine.add(run.run_id)
    return [run for run in runs if run.run_id in mine]


def load_sweep(path) -> Sweep:
    """Run a sweep file and return its ``Sweep`` (from ``sweep()`` or ``SWEEP``).

    Raises ``SweepFileError`` with a one-line reason for a missing file, a
    file that raises, or one that defines no sweep.
    """
    return python_file.load(path, function="sweep", constant="SWEEP", expected=Sweep, what="sweep file")
