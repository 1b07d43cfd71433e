"""A sweep in pieces: what one time-limited command on a lent machine can finish, and how long each takes.

A piece is one command of at most ``PieceSettings.seconds`` of wall clock (a lent machine answers one
command of at most 10 minutes, and nothing on it survives the visit), so every run must finish inside
the piece that starts it: checkpoints never come back. A piece trains packs (``sweeps.packing``: the
runs of one shape, seeds and rates, as one program), cheapest first, and starts a pack only when its
predicted time fits what is left.

The prediction (``SpeedModel``): each pack costs its overhead (compiling its programs, the final
evaluation) plus its steps at a step time. Before anything is measured, the step time is the
pack's model FLOPs per step at the assumed MFU of the device's peak, and at least
``min_step_seconds``; once packs have run (in this piece, or in earlier ones: the ledger keeps their
timing), a pack's step time is scaled from the measured pack of the nearest smaller FLOPs per step
at that pack's MFU (utilisation grows with size, so this errs long), and its overhead is the
largest measured. Importing this module imports no JAX; grouping into packs does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, NamedTuple

from sweeps.packing import Pack
from sweeps.spec import Expansion, RunSpec, Sweep


@dataclasses.dataclass(frozen=True)
class PieceSettings:
    """How a sweep is cut into pieces, and what is assumed before anything is measured.

    ``seconds``: one piece's wall clock (the command's); ``startup_seconds``: what a piece spends before
    and after its packs (installing wheels, verifying and unpacking the corpus, starting JAX, writing
    its records); ``reserve_seconds``: kept free at the end. ``mfu``: model FLOP utilisation assumed
    (fraction of ``base.peak_flops``); ``min_step_seconds``: the shortest step assumed (kernel launches);
    ``pack_overhead_seconds``: compiling and the final evaluation of one pack, assumed; ``margin``: every
    predicted step time is multiplied by it. ``ledger`` and ``fingerprint``: the committed ledger of
    finished runs and the corpus fingerprint (paths relative to the repository).
    """

    seconds: float = 480.0
    startup_seconds: float = 60.0
    reserve_seconds: float = 30.0
    mfu: float = 0.10
    min_step_seconds: float = 0.004
    pack_overhead_seconds: float = 20.0
    margin: float = 1.15
    ledger: str = ""
    fingerprint: str = ""

    def __post_init__(self):
        for field in ("seconds", "startup_seconds", "reserve_seconds", "min_step_seconds", "pack_overhead_seconds"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"piece {field}={value!r} is invalid: allowed a number of seconds >= 0")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"piece mfu={self.mfu!r} is invalid: allowed 0 < mfu <= 1")
        if self.margin < 1:
            raise ValueError(f"piece margin={self.margin!r} is invalid: allowed a factor >= 1")
        if self.usable_seconds <= 0:
            raise ValueError(f"piece seconds={self.seconds} leave nothing after startup_seconds="
                             f"{self.startup_seconds} and reserve_seconds={self.reserve_seconds}")

    @property
    def usable_seconds(self) -> float:
        """Seconds of a piece that packs may take."""
        return self.seconds - self.startup_seconds - self.reserve_seconds


@dataclasses.dataclass(frozen=True)
class PieceSweep(Sweep):
    """A ``Sweep`` trained in pieces (``piece``), with optional rate checks: for each (depth, width, peak rate)
    of ``rate_checks``, the shape's first seed also trains at that rate (a run named ``...-lr1e-03``), in the
    same pack as the shape's own runs."""

    piece: PieceSettings = PieceSettings()
    rate_checks: tuple = ()

    def __post_init__(self):
        if not isinstance(self.piece, PieceSettings):
            raise ValueError(f"piece={self.piece!r} is invalid: allowed a sweeps.piece.plan.PieceSettings")
        checks = tuple((int(d), int(w), float(r)) for d, w, r in self.rate_checks)
        object.__setattr__(self, "rate_checks", checks)
        if checks and (self.lr_grid or any(not r > 0 for _, _, r in checks)):
            raise ValueError(f"rate_checks={checks!r} is invalid: allowed (depth, width, rate > 0), without lr_grid")
        super().__post_init__()

    def expand(self) -> Expansion:
        runs, skipped = super().expand()
        if not self.rate_checks:
            return Expansion(runs, skipped)
        shapes = {(run.depth, run.width): run for run in runs}
        absent = [check for check in self.rate_checks if check[:2] not in shapes]
        if absent:
            raise ValueError(f"rate_checks {absent}: (depth, width) not a shape of sweep {self.name}")
        extra = [self._run(depth, width, seed, rate, shapes[(depth, width)].budget)
                 for depth, width, rate in self.rate_checks for seed in self.seeds[:1]]
        return Expansion(runs + extra, skipped)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "piece": dataclasses.asdict(self.piece),
                "rate_checks": [list(check) for check in self.rate_checks]}


class Measured(NamedTuple):
    """One pack's timing: FLOPs per step of all its runs, seconds per step, overhead seconds (wall minus
    steps: compiling, the final evaluation)."""

    flops_per_step: float
    step_seconds: float
    overhead_seconds: float


def pack_flops_per_step(pack: Pack) -> float:
    """Model FLOPs of one step of every run of ``pack``."""
    return sum(run.flops / run.config.steps for run in pack.runs)


def pack_steps(pack: Pack) -> int:
    return max(run.config.steps for run in pack.runs) - pack.start_step


class SpeedModel:
    """Predicted seconds of a pack: assumed (``settings``, ``peak_flops``) until ``measured`` holds packs."""

    def __init__(self, settings: PieceSettings, peak_flops: float, measured: Iterable[Measured] = ()):
        self.settings, self.peak_flops = settings, peak_flops
        self.measured = sorted(measured)

    def add(self, row: Measured) -> None:
        self.measured = sorted([*self.measured, row])

    def step_seconds(self, flops_per_step: float) -> float:
        """Predicted seconds per step (the margin included) of a pack of ``flops_per_step``."""
        smaller = [row for row in self.measured if row.flops_per_step <= flops_per_step]
        if smaller:
            nearest = smaller[-1]
            step = nearest.step_seconds * max(1.0, flops_per_step / nearest.flops_per_step)
        elif self.measured:  # only larger packs measured: a smaller one is no slower per step
            step = min(row.step_seconds for row in self.measured)
        else:
            step = max(self.settings.min_step_seconds, flops_per_step / (self.peak_flops * self.settings.mfu))
        return step * self.settings.margin

    def overhead_seconds(self) -> float:
        if not self.measured:
            return self.settings.pack_overhead_seconds
        return max(row.overhead_seconds for row in self.measured)

    def seconds(self, pack: Pack) -> float:
        """Predicted wall seconds of ``pack``: overhead plus steps."""
        return self.overhead_seconds() + pack_steps(pack) * self.step_seconds(pack_flops_per_step(pack))

    @property
    def how(self) -> str:
        s = self.settings
        if self.measured:
            return f"the speed measured on {len(self.measured)} pack(s), ×{s.margin:g} margin"
        return (f"{s.mfu:.0%} MFU of {self.peak_flops / 1e12:.0f} TFLOP/s (assumed, not measured), steps of at least "
                f"{s.min_step_seconds * 1e3:g} ms, {s.pack_overhead_seconds:g} s per pack to compile and evaluate, "
                f"×{s.margin:g} margin")


def fitting(packs: list[Pack], model: SpeedModel, seconds: float) -> list[Pack]:
    """``packs`` with every pack whose predicted time exceeds ``seconds`` split into smaller packs that fit
    (halves, again while needed); a single run that does not fit stays as it is (``pieces`` reports it)."""
    out = []
    for pack in packs:
        queue = [pack]
        while queue:
            current = queue.pop(0)
            if len(current.runs) > 1 and model.seconds(current) > seconds:
                half = len(current.runs) // 2
                queue[:0] = [dataclasses.replace(current, runs=current.runs[:half]),
                             dataclasses.replace(current, runs=current.runs[half:])]
            else:
                out.append(current)
    return [dataclasses.replace(pack, label=f"p{i + 1}") for i, pack in enumerate(out)]


class Piece(NamedTuple):
    packs: list[Pack]
    seconds: float  # predicted wall clock of its packs (startup not included)


def next_pack(pending: list[Pack], model: SpeedModel, remaining: float, first: bool) -> Pack | None:
    """The pack a piece trains next, or None when none fits in ``remaining`` seconds: a piece's first pack is
    the cheapest (it measures the speed within seconds), every later one the largest that still fits (so
    a piece fills its time, as first-fit-decreasing packing does). ``pending`` is sorted cheapest first."""
    fitting_ = [pack for pack in pending if model.seconds(pack) <= remaining]
    if not fitting_:
        return None
    return fitting_[0] if first else fitting_[-1]


def pieces(packs: list[Pack], model: SpeedModel) -> tuple[list[Piece], list[Pack]]:
    """``packs`` (cheapest first) cut into pieces of ``usable_seconds`` each as pieces would train them at
    this speed (``next_pack``); and the packs that cannot finish inside any piece (each would need a piece
    to itself and more)."""
    usable = model.settings.usable_seconds
    too_long = [pack for pack in packs if model.seconds(pack) > usable]
    pending = [pack for pack in packs if model.seconds(pack) <= usable]
    done = []
    while pending:
        current, used = [], 0.0
        while (pack := next_pack(pending, model, usable - used, not current)) is not None:
            pending.remove(pack)
            current.append(pack)
            used += model.seconds(pack)
        done.append(Piece(current, used))
    return done, too_long


def describe(plan: list[Piece], too_long: list[Pack], model: SpeedModel) -> list[str]:
    """Lines for dry-run: one per piece (packs, runs, device minutes), then what cannot fit."""
    s = model.settings
    lines = [f"in pieces of {s.seconds / 60:g} min ({s.startup_seconds:g} s to start and finish, "
             f"{s.reserve_seconds:g} s reserve, {s.usable_seconds:g} s for packs), at {model.how}:"]
    for index, piece in enumerate(plan, 1):
        runs = [run for pack in piece.packs for run in pack.runs]
        largest = max(piece.packs, key=model.seconds)
        minutes = (piece.seconds + s.startup_seconds) / 60
        lines.append(f"  piece {index}: {len(piece.packs)} pack(s), {len(runs)} run(s), the longest "
                     f"L{largest.runs[0].depth}-d{largest.runs[0].width} × {len(largest.runs)} "
                     f"(≈{model.seconds(largest) / 60:.1f} min), ≈{minutes:.1f} device-minutes")
    total = sum(piece.seconds + s.startup_seconds for piece in plan) / 60
    lines.append(f"  {len(plan)} piece(s), ≈{total:.0f} device-minutes")
    for pack in too_long:
        lines.append(f"  cannot finish inside one piece: {', '.join(pack.names)} (≈{model.seconds(pack) / 60:.1f} "
                     f"min at this speed, a piece has {s.usable_seconds / 60:.1f})")
    return lines


def runs_of(plan: list[Piece]) -> list[RunSpec]:
    return [run for piece in plan for pack in piece.packs for run in pack.runs]
