"""Which of a sweep's programs the preflight compiles, and how the others are priced from those it did.

Three modes (``python -m sweeps.launch preflight --mode``):

- ``quick`` (the default): compile every program that no other program of
  its family dominates in both depth and width (memory per chip grows with
  both, so these decide whether the whole sweep fits), plus anchor widths:
  for each tiling (width modulo the 128-wide tile), its narrowest and widest
  width and enough between them that neighbouring anchors are at most
  ``MAX_ANCHOR_RATIO`` apart. The other depths of a compiled width are
  re-priced, the other widths interpolated.
- ``depths``: compile one program per distinct width (its deepest) and
  re-price the other depths.
- ``full``: compile every program.

A family is the programs that differ only in depth and width (same batch,
sequence, remat, mesh, ...). Rows say how they were priced (``method``):

- ``compiled``: the compiler's answer for this very program;
- ``re-priced``: a compiled program of the same width with its layer loop
  run this run's depth times (``sweeps.preflight.layer_loop``);
- ``interpolated``: between the two nearest compiled widths of the same
  family and tiling, each figure split into a per-layer part and the rest,
  both interpolated as a power of the width and summed at this run's depth.
  ``interpolation_error`` is measured, not assumed: each compiled anchor
  that has anchors on both sides is predicted from those two neighbours
  (leave-one-out, so over a wider gap than any interpolated row spans) and
  compared with its compiled figures; the largest relative error of the
  three step times in the tiling is the error of every row interpolated in
  it. A tiling with no such anchor interpolates nothing: its runs are compiled.

A run not compiled fits when a compiled run that fits dominates it
(``fits_by``); otherwise its re-priced or interpolated memory decides.
"""

from __future__ import annotations

import dataclasses
import math

import jax

from scaling.config import TrainConfig
from scaling.model import budget
from scaling.model.flops import model_flops_utilization
from sweeps.preflight import estimate_range, layer_loop
from sweeps.preflight.advice import FIT_FRACTION

MODES = ("quick", "depths", "full")
TILE = 128  # the lane width every generation's arrays are tiled to (sweeps.preflight.roofline_corrections)
MAX_ANCHOR_RATIO = 4.0  # neighbouring anchor widths of one tiling are at most this factor apart
STEP_FIELDS = ("estimated_step_seconds", "roofline_corrected_step_seconds", "compiler_step_seconds")


@dataclasses.dataclass(frozen=True)
class Program:
    """One distinct program of a sweep: its key (``report.program_key``), the first run's name and config."""

    key: tuple
    name: str
    config: TrainConfig

    depth = property(lambda self: self.config.model.depth, doc="layers L")
    width = property(lambda self: self.config.model.width, doc="model width d")

    @property
    def family(self) -> str:
        """Everything the program depends on but depth and width, and what follows from width: the μP
        multipliers, and whether hidden matrices get a learning rate of their own (not at the base width)."""
        shape, mesh = self.key
        model = {k: v for k, v in dataclasses.asdict(shape.model).items() if k not in ("depth", "width")}
        return repr((dataclasses.replace(shape, model=None, multipliers=None, grouped=None), sorted(model.items()),
                     mesh))

    @property
    def tiling(self) -> tuple:
        return self.family, self.width % TILE


def dominates(a: Program, b: Program) -> bool:
    """``a`` is at least as deep and as wide as ``b`` (and is another program of its family)."""
    return a.key != b.key and a.family == b.family and a.depth >= b.depth and a.width >= b.width


def non_dominated(programs: list[Program]) -> list[Program]:
    """The programs no other program of their family dominates (the fit check)."""
    return [p for p in programs if not any(dominates(q, p) for q in programs)]


def anchor_widths(widths: list[int], max_ratio: float = MAX_ANCHOR_RATIO) -> list[int]:
    """The narrowest and widest of ``widths`` and, between them, the ones nearest to geometrically spaced
    targets, so that neighbouring anchors are at most about ``max_ratio`` apart."""
    widths = sorted(set(widths))
    if len(widths) <= 2:
        return widths
    gaps = max(1, math.ceil(math.log(widths[-1] / widths[0]) / math.log(max_ratio) - 1e-9))
    gaps = max(gaps, 2)  # one width inside, so the interpolation error can be measured
    chosen = {widths[0], widths[-1]}
    for index in range(1, gaps):
        target = widths[0] * (widths[-1] / widths[0]) ** (index / gaps)
        chosen.add(min(widths[1:-1], key=lambda w: abs(math.log(w / target))))
    return sorted(chosen)


def to_compile(programs: list[Program], mode: str) -> list[Program]:
    """The programs ``mode`` compiles first (``MODES``); ``complete`` may ask for more."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: allowed {', '.join(MODES)}")
    if mode == "full":
        return list(programs)
    deepest = {}
    for program in programs:
        best = deepest.get((program.family, program.width))
        if best is None or program.depth > best.depth:
            deepest[(program.family, program.width)] = program
    if mode == "depths":
        return [p for p in programs if p in deepest.values()]
    chosen = {p.key for p in non_dominated(programs)}
    for tiling in {p.tiling for p in programs}:
        widths = [p.width for p in programs if p.tiling == tiling]
        for width in anchor_widths(widths):
            chosen.add(deepest[(tiling[0], width)].key)
    return [p for p in programs if p.key in chosen]


# ---------------------------------------------------------------------------
# Pricing the programs not compiled


def _usable(row: dict | None) -> bool:
    return bool(row and row.get("per_layer") and row.get("estimated_step_seconds") is not None)


def complete(programs: list[Program], rows: dict, chips: int, chip) -> tuple[dict, list[Program]]:
    """Rows for every program: ``rows`` (key -> compiled row) plus re-priced and interpolated ones.

    Returns (key -> row, the programs that can be priced neither way and must be compiled).
    """
    by_key = {p.key: p for p in programs}
    compiled = {key: row for key, row in rows.items() if row.get("method", "compiled") == "compiled"}
    done, missing = dict(compiled), []
    anchors = _anchors(programs, compiled)
    errors = {tiling: interpolation_errors(found) for tiling, found in anchors.items()}
    for program in programs:
        if program.key in done:
            continue
        sources = [by_key[key] for key, row in compiled.items() if _usable(row) and by_key[key].family ==
                   program.family and by_key[key].width == program.width]
        if sources:  # the nearest depth, the deeper one on a tie (it dominates)
            source = min(sources, key=lambda p: (abs(p.depth - program.depth), -p.depth))
            done[program.key] = repriced(compiled[source.key], source, program, chips, chip)
            continue
        found, error = anchors.get(program.tiling, []), errors.get(program.tiling)
        between = _neighbours(found, program.width)
        if between is None or error is None:
            missing.append(program)
            continue
        done[program.key] = interpolated(between, program, error, chips, chip)
    for program in programs:
        row = done.get(program.key)
        if row is not None and row.get("method", "compiled") != "compiled":
            _fit_by_dominance(row, program, [(by_key[k], r) for k, r in compiled.items()])
    return done, missing


def _anchors(programs: list[Program], compiled: dict) -> dict:
    """tiling -> [(width, program, row)] of its compiled widths that can be re-priced, narrowest first."""
    found: dict = {}
    for program in programs:
        row = compiled.get(program.key)
        if not _usable(row):
            continue
        widths = found.setdefault(program.tiling, {})
        if program.width not in widths or program.depth > widths[program.width][1].depth:
            widths[program.width] = (program.width, program, row)
    return {tiling: [widths[w] for w in sorted(widths)] for tiling, widths in found.items()}


def _neighbours(found: list, width: int):
    for left, right in zip(found, found[1:]):
        if left[0] < width < right[0]:
            return left, right
    return None


def _linear_fields(row: dict) -> dict:
    return {key: row.get(key) for key in layer_loop.LINEAR_FIELDS + layer_loop.MEMORY_FIELDS + ("temporary_bytes",)}


def _at_depth(row: dict, depth_from: int, depth_to: int) -> dict:
    """The linear fields of a compiled ``row`` with its layer loop run ``depth_to`` instead of ``depth_from`` times."""
    return layer_loop.combine(_linear_fields(row), row["per_layer"]["fields"], depth_to - depth_from)


def _power_between(a, b, width_a: int, width_b: int, width: int):
    """Leaf by leaf, the value at ``width`` of the power law through (width_a, a) and (width_b, b); linear where
    either is not positive."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {key: _power_between(a.get(key), b.get(key), width_a, width_b, width) for key in set(a) | set(b)}
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [_power_between(x, y, width_a, width_b, width) for x, y in zip(a, b)]
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or isinstance(a, bool):
        return None
    share = math.log(width / width_a) / math.log(width_b / width_a)
    if a > 0 and b > 0:
        return math.exp(math.log(a) + share * (math.log(b) - math.log(a)))
    return a + share * (b - a)


def _interpolate_fields(left, right, width: int, depth: int) -> dict:
    """The linear fields at (``width``, ``depth``) from two anchors (width, program, row)."""
    parts = []
    for _, program, row in (left, right):
        base = _at_depth(row, program.depth, 0)
        parts.append((base, row["per_layer"]["fields"]))
    base = _power_between(parts[0][0], parts[1][0], left[0], right[0], width)
    layer = _power_between(parts[0][1], parts[1][1], left[0], right[0], width)
    return layer_loop.combine(base, layer, depth)


def interpolation_errors(found: list) -> dict | None:
    """Leave-one-out over a tiling's anchors: each inner anchor predicted from its two neighbours.

    Returns {"step": the largest relative error of the ``STEP_FIELDS``, "memory": of HBM per chip, "anchors":
    how many were predicted}, or None with no inner anchor.
    """
    step = memory = 0.0
    inner = 0
    for left, middle, right in zip(found, found[1:], found[2:]):
        width, program, row = middle
        predicted = _interpolate_fields(left, right, width, program.depth)
        for key in STEP_FIELDS:
            if row.get(key) and predicted.get(key) is not None:
                step = max(step, abs(predicted[key] / row[key] - 1))
        if row.get("hbm_bytes_per_device") and predicted.get("hbm_bytes_per_device") is not None:
            memory = max(memory, abs(predicted["hbm_bytes_per_device"] / row["hbm_bytes_per_device"] - 1))
        inner += 1
    return {"step": step, "memory": memory, "anchors": inner} if inner else None


def repriced(row: dict, source: Program, program: Program, chips: int, chip) -> dict:
    """``program``'s row from the compiled ``row`` of ``source`` (same family and width, another depth)."""
    fields = _at_depth(row, source.depth, program.depth)
    note = f"{source.name}'s layer loop run {program.depth} instead of {source.depth} times"
    return _derived(row, fields, program, "re-priced", note, chips, chip)


def interpolated(between, program: Program, error: dict, chips: int, chip) -> dict:
    """``program``'s row between two anchors (width, program, row) of its tiling, with the tiling's error."""
    (_, left, left_row), (_, right, _) = between
    fields = _interpolate_fields(*between, program.width, program.depth)
    note = (f"between {left.name} and {right.name}; ±{error['step']:.1%} step time, ±{error['memory']:.1%} HBM "
            f"(leave-one-out over {error['anchors']} compiled width{'s' if error['anchors'] > 1 else ''})")
    row = _derived(left_row, fields, program, "interpolated", note, chips, chip)
    row.update(interpolation_error=error["step"], interpolation_memory_error=error["memory"])
    return row


def _derived(template: dict, fields: dict, program: Program, method: str, note: str, chips: int, chip) -> dict:
    """A row of ``program`` from the linear ``fields``: every figure that follows from them recomputed."""
    config = program.config
    row = dict(template, **fields)
    peak = chip.bf16_flops
    tokens = config.batch_size * config.data.seq_len

    def mfu(seconds):
        return model_flops_utilization(config.model, config.data.seq_len, tokens / seconds, peak, chips) \
            if seconds else None

    corrected, compiler = row.get("roofline_corrected_step_seconds"), row.get("compiler_step_seconds")
    known = [s for s in (corrected, compiler) if s is not None]
    low = min(known) if known else None
    high = max(known) if corrected is not None and compiler is not None else None
    exposed = row.get("exposed_collective_seconds")
    terms = {"compute": row.get("compute_seconds"), "memory": row.get("memory_seconds"), "collectives": exposed}
    planned = row.get("hbm_bytes_per_device")
    fits = planned is not None and planned <= FIT_FRACTION * chip.hbm_bytes
    row.update(name=program.name, method=method, method_note=note, per_layer=None, compile_seconds=None,
               compile_cached=False, remat_suggestion=None, suggestion=None, error=None,
               estimated_mfu=mfu(row.get("estimated_step_seconds")),
               mfu_upper_bound=mfu(row["flops"] / peak if row.get("flops") else None),
               bound=max(terms, key=lambda k: terms[k] or 0.0) if None not in terms.values() else None,
               step_seconds_low=low, step_seconds_high=high,
               mfu_low=estimate_range.mfu(config, high, chips, peak), mfu_high=estimate_range.mfu(config, low, chips, peak),
               mfu_causal_low=estimate_range.mfu(config, high, chips, peak, "causal"),
               mfu_causal_high=estimate_range.mfu(config, low, chips, peak, "causal"),
               model_flops_per_chip=estimate_range.model_flops_per_step(config) / chips,
               tokens_per_step=tokens, remat=config.model.remat, attention_impl=config.model.attention_impl,
               parameters=_parameter_count(config), fits=fits, status="PASS" if fits else "FAIL",
               fits_by="estimated memory")
    for key in ("loops_counted", "loops_uncounted", "kernels_uncounted"):
        row[key] = template.get(key)
    row["params_non_embedding"] = budget.non_embedding_params(config.model.depth, config.model.width)
    return row


def _parameter_count(config: TrainConfig) -> int:
    """Parameters of ``config``'s model as stored (vocabulary padded), as ``report.parameter_count`` counts them."""
    tree = budget.abstract_params(config.model, padded=True)
    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree))


def _fit_by_dominance(row: dict, program: Program, compiled: list) -> None:
    """A run that a compiled, fitting run dominates fits (memory grows with depth and width)."""
    for other, other_row in compiled:
        if other_row.get("fits") and dominates(other, program):
            row.update(fits=True, status="PASS", fits_by=f"dominated by {other.name}, compiled")
            return
