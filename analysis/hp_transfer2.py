"""Learning-rate transfer, second experiment: the best rate per shape from a parabola over seeds, with intervals.

    python -m analysis hp-transfer2 results/hp_transfer2                 # tables and verdicts (markdown)
    python -m analysis hp-transfer2 results/hp_transfer2 --json          # the same as JSON
    python -m analysis hp-transfer2 results/hp_transfer2 --figure results/hp_transfer2/loss_vs_lr.png
    python -m analysis hp-transfer2 results/hp_transfer2 --decisions     # what the next stage runs (JSON)

Reads the finished runs of ``sweeps/configs/hp_transfer2.py``; ``results/hp_transfer2/README.md``
pre-registers the design, these estimates and the criterion:

- per shape, a parabola in x = log2(peak rate) fitted by least squares to every finished run (each
  seed a point); the best rate is its vertex, and its interval the 2.5 and 97.5 percentiles of the
  vertex over ``BOOTSTRAP`` resamples that draw each rate's seeds with replacement, independently;
- per parametrization and axis, the drift: the least-squares slope of the best log2 rate against
  log2(size) over the axis's shapes (log2-rate per doubling; 0 when the optimum stays put), with the
  interval from the same resamples (the base shape's resample shared by the parametrizations);
- the verdicts of ``criterion``.

The design constants below are the pre-registered grid; ``sweeps/configs/hp_transfer2.py`` builds its
runs from them. The module runs on partial records: a shape without its runs is listed as waiting and
an axis missing one is ``incomplete``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import zlib

import numpy as np
import pandas as pd

from analysis.errors import AnalysisInputError
from analysis.results import load_runs

# ---------------------------------------------------------------- the pre-registered design
BASE_WIDTH, BASE_DEPTH = 64, 2
WIDTHS = (64, 128, 256, 512)  # at BASE_DEPTH
DEPTHS = (2, 4, 8, 16)  # at BASE_WIDTH
SEEDS = (0, 1, 2)
BASE_MULTIPLIERS = (0.5, 1.0, 2.0, 4.0)  # optim.output_multiplier tried at the base shape
READOUT_INITS = ("normal", "zero")  # optim.zero_init_readout false / true
BASE_STEPS = (-2, -1, 0, 1, 2)  # stage 1: lattice indices of the base tuning's rates
SPAN = (-2, -1, 0, 1, 2)  # stage 2: lattice indices around each shape's expected optimum
# Where stage 2 centres each shape's rates: lattice steps (factors √2) per doubling of the size, from the
# base rate. The transferring parametrizations are expected to stay put; the standard one to fall as
# 1/width along width and as 1/sqrt(depth) along depth (results/hp_transfer's observation, 600 steps).
EXPECTED_STEPS = {("mup", "width"): 0, ("standard", "width"): -2, ("completep", "depth"): 0,
                  ("standard", "depth"): -1}
COMPARED = {"width": ("mup", "standard"), "depth": ("completep", "standard")}  # (transferring, reference)
EXTENSION = 2  # extra rates beyond the end nearer an unresolved optimum, added once

# ---------------------------------------------------------------- the pre-registered estimates
BOOTSTRAP = 2000
LEVEL = 0.95
TOLERANCE = 0.25  # |drift| in log2-rate per doubling that still counts as "stays put"
EDGE = 0.25  # a vertex up to half a lattice step (log2) beyond the outer rates still counts as inside
NONCONVEX_LIMIT = 0.05  # a shape with more resamples than this whose parabola opens downward is unresolved


def lattice_rate(index: int) -> float:
    """Rate ``index`` of the √2 lattice through 1e-2: 1e-2·2^(index/2), rounded to 3 significant digits."""
    return float(f"{1e-2 * 2 ** (index / 2):.3g}")


def lattice_index(rate: float) -> int:
    """The lattice index nearest ``rate``."""
    return round(2 * math.log2(rate / 1e-2))


def base_tag(multiplier: float, init: str) -> str:
    """Variant tag of a stage-1 (base tuning) run: ``base-m2-zero``."""
    return f"base-m{multiplier:g}-{init}"


def shape_tag(name: str, axis: str, size: int, extension: bool = False) -> str:
    """Variant tag of a stage-2 run: ``mup-w256``, ``completep-L8`` (``-x``: the grid's one extension)."""
    return f"{name}-{'w' if axis == 'width' else 'L'}{size}" + ("-x" if extension else "")


def stage2_indices(base_index: int, name: str, axis: str, size: int) -> list[int]:
    """Lattice indices of a stage-2 shape: ``SPAN`` around the base rate moved by ``EXPECTED_STEPS``."""
    base = BASE_WIDTH if axis == "width" else BASE_DEPTH
    centre = base_index + EXPECTED_STEPS[name, axis] * round(math.log2(size / base))
    return [centre + step for step in SPAN]


# ---------------------------------------------------------------- records
_NAME = re.compile(r"^(?P<tag>.+)-L\d+-d\d+-s\d+(-lr.+)?$")


def tag_of(name: str) -> str:
    """The variant tag a run name starts with (``mup-w256`` of ``mup-w256-L2-d256-s0-lr5e-03``)."""
    found = _NAME.match(name)
    return found.group("tag") if found else ""


def runs(directory) -> pd.DataFrame:
    """Every finished or diverged run: tag, depth, width, seed, peak_lr, x = log2(rate), loss (NaN when
    diverged), status. Stage 1's settings differ at one shape and rate, told apart by their tags."""
    table = load_runs(directory, told_apart_by=tag_of)
    finished = table.runs.assign(status="finished")
    frames = [finished[["name", "depth", "width", "seed", "peak_lr", "loss", "status"]]]
    if table.unfinished is not None and not table.unfinished.empty:
        diverged = table.unfinished[table.unfinished["status"] == "diverged"].copy()
        diverged["peak_lr"] = diverged["name"].map(lambda name: float(name.rsplit("-lr", 1)[1]))
        frames.append(diverged.assign(loss=math.nan)[["name", "depth", "width", "seed", "peak_lr", "loss", "status"]])
    frame = pd.concat(frames, ignore_index=True)
    frame["tag"] = frame["name"].map(tag_of)
    frame["x"] = np.log2(frame["peak_lr"].astype(float))
    return frame


# ---------------------------------------------------------------- fits
@dataclasses.dataclass(frozen=True)
class Fit:
    """The parabola of one shape: ``vertex`` (log2 rate, NaN when it opens downward), ``min_loss`` (its
    value there), ``replicates`` (the resampled vertices, NaN where a resample opens downward), the
    sampled log2 rates ``xs``, runs used and left out (rates with a diverged seed)."""

    vertex: float
    min_loss: float
    replicates: np.ndarray
    xs: tuple
    runs: int
    diverged_rates: tuple = ()

    @property
    def inside(self) -> bool:
        return bool(np.isfinite(self.vertex) and min(self.xs) - EDGE <= self.vertex <= max(self.xs) + EDGE)

    @property
    def nonconvex_share(self) -> float:
        return float(np.mean(~np.isfinite(self.replicates)))

    @property
    def resolved(self) -> bool:
        """Whether the optimum is located: a convex fit, vertex inside the grid, few downward resamples."""
        return self.inside and self.nonconvex_share <= NONCONVEX_LIMIT

    def interval(self) -> tuple[float, float]:
        """The vertex's percentile interval at ``LEVEL`` (log2 rate; NaN when unresolved)."""
        if not self.resolved:
            return (math.nan, math.nan)
        tail = 100 * (1 - LEVEL) / 2
        return tuple(float(v) for v in np.nanpercentile(self.replicates, [tail, 100 - tail]))


def _vertices(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertex and minimum of the least-squares parabola y ≈ a·x² + b·x + c, for each row of ``y``
    (NaN where a <= 0)."""
    design = np.stack([x ** 2, x, np.ones_like(x)], axis=1)
    (a, b, c), *_ = np.linalg.lstsq(design, np.atleast_2d(y).T, rcond=None)
    convex = a > 0
    vertex = np.where(convex, -b / np.where(convex, 2 * a, 1), math.nan)
    return vertex, np.where(convex, c - b ** 2 / np.where(convex, 4 * a, 1), math.nan)


def fit(points: pd.DataFrame, key: str) -> Fit | None:
    """The parabola of one shape's runs (``runs`` rows); rates with a diverged seed are left out. None when
    fewer than 3 rates remain. ``key`` seeds the resampling, so every fit is reproducible."""
    diverged = sorted(points.loc[points["status"] == "diverged", "x"].unique())
    kept = points[~points["x"].isin(diverged)].sort_values(["x", "seed"])
    groups = [group["loss"].to_numpy(float) for _, group in kept.groupby("x")]
    if len(groups) < 3:
        return None
    x = kept["x"].to_numpy(float)
    vertex, min_loss = _vertices(x, kept["loss"].to_numpy(float))
    rng = np.random.default_rng([20260528, zlib.crc32(key.encode())])
    resampled = np.concatenate([group[rng.integers(0, len(group), (BOOTSTRAP, len(group)))] for group in groups],
                               axis=1)
    replicates, _ = _vertices(x, resampled)
    return Fit(float(vertex[0]), float(min_loss[0]), replicates, tuple(sorted(set(x.tolist()))), len(kept),
               tuple(float(v) for v in diverged))


def complete(points: pd.DataFrame, rates: int) -> bool:
    """Whether a shape has every seed of ``SEEDS`` at ``rates`` distinct rates (finished or diverged)."""
    counts = points.groupby("x")["seed"].nunique()
    return len(counts) >= rates and bool((counts >= len(SEEDS)).all())


def _means(points: pd.DataFrame) -> pd.Series:
    """Mean loss over seeds per log2 rate; NaN at a rate where a seed diverged (worse than any finished)."""
    return points.groupby("x")["loss"].apply(lambda losses: float(np.mean(losses.to_numpy(float))))


# ---------------------------------------------------------------- stage 1: the base settings
def base_fits(frame: pd.DataFrame) -> dict[str, Fit | None]:
    """Stage 1: one fit per (output multiplier, readout start) at the base shape, by tag; None until complete."""
    fits = {}
    for multiplier in BASE_MULTIPLIERS:
        for init in READOUT_INITS:
            tag = base_tag(multiplier, init)
            points = frame[frame["tag"] == tag]
            fits[tag] = fit(points, tag) if complete(points, len(BASE_STEPS)) else None
    return fits


def choose_base(frame: pd.DataFrame, fits: dict[str, Fit | None]) -> dict | None:
    """The pre-registered choice, once every stage-1 fit exists: the setting with the lowest mean loss
    over seeds at any of its rates, and as the base rate the lattice rate nearest its parabola's vertex
    (kept inside the stage-1 grid), or its best sampled rate when the vertex is not located. None before."""
    if not fits or any(found is None for found in fits.values()):
        return None
    means = {tag: _means(frame[frame["tag"] == tag]) for tag in fits}
    tag = min(fits, key=lambda t: means[t].min())
    chosen = fits[tag]
    x = chosen.vertex if chosen.resolved else float(means[tag].idxmin())
    index = min(max(round(2 * (x - math.log2(1e-2))), min(BASE_STEPS)), max(BASE_STEPS))
    multiplier, init = tag.split("-")[1][1:], tag.split("-")[2]
    return {"tag": tag, "output_multiplier": float(multiplier), "zero_init_readout": init == "zero",
            "base_index": int(index), "base_rate": lattice_rate(index)}


# ---------------------------------------------------------------- stage 2: shapes, drifts, criterion
def shape_fits(frame: pd.DataFrame, base: dict | None, base_fit: Fit | None) -> dict:
    """(parametrization, axis, size) -> Fit or None (waiting), for every compared shape; the base shape is
    stage 1's fit at the chosen setting, shared by the parametrizations. Extension runs join their shape."""
    fits = {}
    for axis, names in COMPARED.items():
        sizes = WIDTHS if axis == "width" else DEPTHS
        for name in names:
            for size in sizes:
                if size == (BASE_WIDTH if axis == "width" else BASE_DEPTH):
                    fits[name, axis, size] = base_fit
                    continue
                tags = (shape_tag(name, axis, size), shape_tag(name, axis, size, extension=True))
                points = frame[frame["tag"].isin(tags)]
                ready = base is not None and complete(points[points["tag"] == tags[0]], len(SPAN))
                fits[name, axis, size] = fit(points, tags[0]) if ready else None
    return fits


def _slope(fits: dict, name: str, axis: str, sizes: list[int]) -> dict:
    """Least-squares slope of the best log2 rate against log2(size) over ``sizes``, its interval over
    the shapes' shared resamples, and the resampled slopes."""
    chosen = [fits[name, axis, size] for size in sizes]
    x = np.log2(np.array(sizes, float))
    x = x - x.mean()
    replicates = np.stack([found.replicates for found in chosen], axis=1) @ x / np.dot(x, x)
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.nanpercentile(replicates, [tail, 100 - tail])
    return {"drift": float(np.dot(x, [found.vertex for found in chosen]) / np.dot(x, x)),
            "interval": [float(low), float(high)], "replicates": replicates}


def drift(fits: dict, name: str, axis: str) -> dict | None:
    """Slope of the best log2 rate against log2(size) along ``axis`` for ``name``, its interval, and its
    resampled values; None while a shape waits or is unresolved."""
    sizes = WIDTHS if axis == "width" else DEPTHS
    if any(fits[name, axis, size] is None or not fits[name, axis, size].resolved for size in sizes):
        return None
    return _slope(fits, name, axis, list(sizes))


def located_drift(fits: dict, name: str, axis: str) -> dict | None:
    """Descriptive, never a verdict (README, "Descriptive readings"): ``drift``'s slope over only the
    shapes of ``axis`` whose optimum is located, with its interval and the sizes used; None with fewer
    than 2 located shapes."""
    sizes = [size for size in (WIDTHS if axis == "width" else DEPTHS)
             if fits[name, axis, size] is not None and fits[name, axis, size].resolved]
    if len(sizes) < 2:
        return None
    found = _slope(fits, name, axis, sizes)
    return {"parametrization": name, "axis": axis, "sizes": sizes, "drift": found["drift"],
            "interval": found["interval"]}


def criterion(fits: dict) -> dict:
    """Per axis, with T the transferring parametrization and S the standard one (README, criterion):
    ``holds`` when T's drift interval lies within ±TOLERANCE, S's lies wholly outside it, and the interval
    of |drift S| − |drift T| lies above 0; ``fails`` when T's interval lies wholly outside ±TOLERANCE, or
    that difference's interval lies below 0, or both T's and S's intervals lie within ±TOLERANCE (nothing
    for T to improve on); ``inconclusive`` otherwise or when a shape's optimum is not located;
    ``incomplete`` while runs are missing."""
    verdicts = {}
    for axis, (transferring, standard) in COMPARED.items():
        shapes = {key: found for key, found in fits.items() if key[1] == axis}
        if any(found is None for found in shapes.values()):
            waiting = [f"{key[0]} {key[2]}" for key, found in shapes.items() if found is None]
            verdicts[axis] = {"verdict": "incomplete", "why": f"waiting for {', '.join(waiting)}"}
            continue
        unresolved = [f"{key[0]} {key[2]}" for key, found in shapes.items() if not found.resolved]
        if unresolved:
            verdicts[axis] = {"verdict": "inconclusive", "why": f"optimum not located: {', '.join(unresolved)}"}
            continue
        ours, theirs = drift(fits, transferring, axis), drift(fits, standard, axis)
        gap = np.abs(theirs["replicates"]) - np.abs(ours["replicates"])
        tail = 100 * (1 - LEVEL) / 2
        gap_interval = [float(v) for v in np.nanpercentile(gap, [tail, 100 - tail])]
        within = lambda iv: -TOLERANCE <= iv[0] and iv[1] <= TOLERANCE  # noqa: E731
        beyond = lambda iv: iv[0] > TOLERANCE or iv[1] < -TOLERANCE  # noqa: E731
        if within(ours["interval"]) and beyond(theirs["interval"]) and gap_interval[0] > 0:
            verdict = "holds"
        elif beyond(ours["interval"]) or gap_interval[1] < 0 or (within(ours["interval"])
                                                                  and within(theirs["interval"])):
            verdict = "fails"
        else:
            verdict = "inconclusive"
        verdicts[axis] = {"verdict": verdict, f"{transferring}_drift": ours["drift"],
                          f"{transferring}_interval": ours["interval"], f"{standard}_drift": theirs["drift"],
                          f"{standard}_interval": theirs["interval"], "gap_interval": gap_interval}
    return verdicts


# ---------------------------------------------------------------- decisions for the next stage
def extensions(frame: pd.DataFrame, base: dict) -> list[dict] | None:
    """Once every stage-2 shape is complete: the shapes whose optimum is unresolved on stage 2's own runs,
    each with ``EXTENSION`` more lattice rates beyond the end nearer its vertex (or, for a parabola
    opening downward, beyond the end with the lower mean loss). None until then."""
    added = []
    for axis, names in COMPARED.items():
        for name in names:
            for size in (WIDTHS if axis == "width" else DEPTHS)[1:]:
                tag = shape_tag(name, axis, size)
                points = frame[frame["tag"] == tag]
                if not complete(points, len(SPAN)):
                    return None
                found = fit(points, tag)
                if found is not None and found.resolved:
                    continue
                indices = extension_indices(found, points, stage2_indices(base["base_index"], name, axis, size))
                added.append({"parametrization": name, "axis": axis, "size": size, "indices": indices})
    return added


def extension_indices(found: Fit | None, points: pd.DataFrame, indices: list[int]) -> list[int]:
    """The ``EXTENSION`` lattice indices that extend an unresolved shape's grid ``indices`` (its runs
    ``points``, their fit ``found``): beyond the end nearer the fitted vertex, or, for a parabola opening
    downward, beyond the end with the lower mean loss (a diverged end counts as the higher)."""
    if found is not None and np.isfinite(found.vertex):
        upward = found.vertex > (min(found.xs) + max(found.xs)) / 2
    else:
        means = _means(points)
        top, bottom = means.loc[means.index.max()], means.loc[means.index.min()]
        upward = bool(np.isfinite(top) and not top >= bottom)
    end = max(indices) if upward else min(indices)
    step = 1 if upward else -1
    return [end + step * k for k in range(1, EXTENSION + 1)]


def decisions(directory) -> dict:
    """What the sweep runs next, from the records by the pre-registered rules: ``base`` (stage 1's choice,
    None until stage 1 is complete) and ``extensions`` (None until stage 2 is complete)."""
    frame = runs(directory)
    base = choose_base(frame, base_fits(frame))
    return {"base": base, "extensions": extensions(frame, base) if base else None}


# ---------------------------------------------------------------- budget
# Wall-clock hours the README budgets per stage ("Budget (stated before any run)"): stage 2 is its widths
# 128, 256 and 512 (0.4 + 1.1 + 3.7) and its depths (1.25); stage 3 at most.
STAGE_BUDGET_HOURS = {1: 1.1, 2: 6.45, 3: 1.5}
BUDGET_HOURS = 10.0


def stage_of(tag: str) -> int:
    """The stage a variant tag belongs to: 1 (base tuning), 2 (transfer) or 3 (an extension, ``-x``)."""
    return 1 if tag.startswith("base-") else 3 if tag.endswith("-x") else 2


def budget(directory) -> list[dict]:
    """Per stage: its packs (a shape's runs, one program: each run's record holds the pack's wall clock
    summed over its segments, ``wall_seconds``) and their wall-clock hours, against the README's budget.
    Time an interrupted segment spent after its last checkpoint is in no record, so it is not counted."""
    from etils import epath

    packs: dict[str, float] = {}
    for path in epath.Path(directory).glob("*/result.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):  # unreadable or half written: load_runs reports it; no time to count
            continue
        if record.get("status") in ("finished", "diverged") and record.get("wall_seconds") is not None:
            tag = tag_of(record["name"])
            packs[tag] = max(packs.get(tag, 0.0), float(record["wall_seconds"]))
    return [{"stage": stage, "packs": sum(stage_of(tag) == stage for tag in packs),
             "hours": sum(seconds for tag, seconds in packs.items() if stage_of(tag) == stage) / 3600,
             "budgeted_hours": hours} for stage, hours in STAGE_BUDGET_HOURS.items()]


# ---------------------------------------------------------------- report
def base_extension_runs(directories, base: dict) -> pd.DataFrame:
    """The exploratory extensions of the base shape (README, "Exploratory addition" and "Follow-up";
    ``sweeps/configs/hp_transfer2_base_*.py``): the runs in ``directories`` (a list of folders), tagged as
    the chosen base setting's so that they join that setting's fit. Each folder must hold some."""
    found = []
    for directory in directories:
        added = runs(directory)
        added = added[added["tag"] == base["tag"] + "-x"].assign(tag=base["tag"])
        if added.empty:
            raise AnalysisInputError(f"{directory}: no finished run of a base extension ({base['tag']}-x-...); "
                                     "its sweeps are sweeps/configs/hp_transfer2_base_*.py")
        found.append(added)
    return pd.concat(found, ignore_index=True)


def plotted_runs(directory, result: dict, base_extension=None) -> pd.DataFrame:
    """The runs the figure draws: the experiment's, and the ``base_extension`` folders' as the base shape's."""
    frame = runs(directory)
    if base_extension is None or not result["chosen"]:
        return frame
    return pd.concat([frame, base_extension_runs(base_extension, result["chosen"])], ignore_index=True)


def outcome(directory, base_extension=None) -> dict:
    """Everything the report prints: base tuning, per-shape fits, drifts and verdicts (JSON-ready).

    With ``base_extension`` (a list of exploratory extensions' folders) the base shape's fit also takes their
    runs, and only that fit changes: stage 1's choice and the stages' grids stay the registered records'.
    The result is then exploratory (``result["exploratory"]``), never the registered outcome."""
    frame = runs(directory)
    fits1 = base_fits(frame)
    base = choose_base(frame, fits1)
    chosen = fits1[base["tag"]] if base else None
    exploratory = None
    if base_extension is not None and base is not None:
        added = base_extension_runs(base_extension, base)
        # Waiting (None) until every seed of the extension's rates is in, as a stage-2 shape waits.
        chosen = fit(pd.concat([frame[frame["tag"] == base["tag"]], added], ignore_index=True), base["tag"]) \
            if complete(added, EXTENSION) else None
        exploratory = {"base_extension": ", ".join(map(str, base_extension)), "added_runs": len(added),
                       "added_rates": sorted(float(rate) for rate in added["peak_lr"].unique())}
    fits2 = shape_fits(frame, base, chosen)

    def described(found: Fit | None) -> dict:
        if found is None:
            return {"status": "waiting"}
        low, high = found.interval()
        return {"status": "resolved" if found.resolved else "unresolved", "runs": found.runs,
                "best_rate": 2 ** found.vertex if np.isfinite(found.vertex) else None,
                "interval": [2 ** low, 2 ** high] if found.resolved else None, "loss_at_best": found.min_loss
                if np.isfinite(found.min_loss) else None, "downward_resamples": found.nonconvex_share,
                "diverged_rates": [2 ** x for x in found.diverged_rates]}

    drifts = [{"parametrization": name, "axis": axis, "drift": found["drift"], "interval": found["interval"]}
              for axis, names in COMPARED.items() for name in names
              if (found := drift(fits2, name, axis)) is not None]
    result = {"base": [{"tag": tag, **described(found)} for tag, found in fits1.items()], "chosen": base,
              "shapes": [{"parametrization": name, "axis": axis, "size": size, **described(found)}
                         for (name, axis, size), found in fits2.items()],
              "drifts": drifts, "criterion": criterion(fits2), "budget": budget(directory),
              "located_drifts": [found for axis, names in COMPARED.items() for name in names
                                 if (found := located_drift(fits2, name, axis)) is not None]}
    return result if exploratory is None else {"exploratory": exploratory, **result}


def markdown(result: dict) -> str:
    """The outcome as markdown tables and one line per verdict."""
    def interval(row):
        return f"{row['interval'][0]:.3g}–{row['interval'][1]:.3g}" if row.get("interval") else "-"

    lines = []
    if result.get("exploratory"):
        added = result["exploratory"]
        lines += [f"EXPLORATORY, not the registered outcome: the base shape's fit also takes {added['added_runs']} "
                  f"runs at rates {', '.join(f'{rate:.3g}' for rate in added['added_rates'])} from "
                  f"{added['base_extension']} (README: \"Exploratory addition\", \"Follow-up\")", ""]
    lines += ["Stage 1, base shape (output multiplier, readout start):", "",
             "| setting | status | runs | best rate | 95% interval | loss at best |", "|---|---|---|---|---|---|"]
    for row in result["base"]:
        best = f"{row['best_rate']:.3g}" if row.get("best_rate") else "-"
        loss = f"{row['loss_at_best']:.4f}" if row.get("loss_at_best") else "-"
        lines.append(f"| {row['tag']} | {row['status']} | {row.get('runs', 0)} | {best} | {interval(row)} | {loss} |")
    chosen = result["chosen"]
    lines += ["", f"chosen: {chosen['tag']} at rate {chosen['base_rate']:.3g}" if chosen else "chosen: not yet", "",
              "| parametrization | axis | size | status | best rate | 95% interval | loss at best |",
              "|---|---|---|---|---|---|---|"]
    for row in result["shapes"]:
        best = f"{row['best_rate']:.3g}" if row.get("best_rate") else "-"
        loss = f"{row['loss_at_best']:.4f}" if row.get("loss_at_best") else "-"
        lines.append(f"| {row['parametrization']} | {row['axis']} | {row['size']} | {row['status']} | {best} | "
                     f"{interval(row)} | {loss} |")
    lines += ["", "| parametrization | axis | drift (log2 rate per doubling) | 95% interval |", "|---|---|---|---|"]
    for row in result["drifts"]:
        lines.append(f"| {row['parametrization']} | {row['axis']} | {row['drift']:+.3f} | "
                     f"{row['interval'][0]:+.3f} to {row['interval'][1]:+.3f} |")
    if result.get("located_drifts"):
        lines += ["", "Descriptive, not part of the criterion: the drift over the located shapes only",
                  "", "| parametrization | axis | sizes | drift (log2 rate per doubling) | 95% interval |",
                  "|---|---|---|---|---|"]
        for row in result["located_drifts"]:
            lines.append(f"| {row['parametrization']} | {row['axis']} | {', '.join(map(str, row['sizes']))} | "
                         f"{row['drift']:+.3f} | {row['interval'][0]:+.3f} to {row['interval'][1]:+.3f} |")
    lines += ["", "| stage | packs | wall-clock hours | budgeted |", "|---|---|---|---|"]
    for row in result["budget"]:
        over = " (over by more than half)" if row["hours"] > 1.5 * row["budgeted_hours"] else ""
        lines.append(f"| {row['stage']} | {row['packs']} | {row['hours']:.2f}{over} | {row['budgeted_hours']:g} |")
    total = sum(row["hours"] for row in result["budget"])
    lines += [f"| all | {sum(row['packs'] for row in result['budget'])} | {total:.2f} | at most {BUDGET_HOURS:g} |",
              ""]
    for axis, verdict in result["criterion"].items():
        why = f" ({verdict['why']})" if "why" in verdict else ""
        gap = verdict.get("gap_interval")
        extra = f"; |standard drift| − |{COMPARED[axis][0]} drift| in {gap[0]:+.3f} to {gap[1]:+.3f}" if gap else ""
        lines.append(f"criterion along {axis}: {verdict['verdict']}{why}{extra}")
    return "\n".join(lines)

