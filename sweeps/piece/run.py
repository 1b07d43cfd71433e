"""One piece: the next packs of a sweep that fit a time budget, trained on this machine, written under ``$OUT``.

In order: the corpus archive is checked against the committed fingerprint's SHA-256 and unpacked; the
ledger's finished runs are set aside; the rest are grouped into packs (``sweeps.packing``, cheapest
first; a pack too long for a piece is split) and trained one pack at a time, each only when its
predicted time (``sweeps.piece.plan.SpeedModel``, updated from every pack this piece and earlier ones
timed) fits what is left of the budget. A timer stops a pack that runs past the budget anyway, so that
the records still come back. Runs train with wandb disabled and no checkpoints but their last (they
cannot come back), in a scratch folder; their records, the piece's summary (``piece.json``) and its
timing table (``timing.md``) are written under the output folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import shutil
import tempfile
import threading
import time

from sweeps.piece import ledger as ledger_lib
from sweeps.piece.packages import REPO
from sweeps.piece import plan as plan_lib

FINISH_SECONDS = 10.0  # what writing the outputs takes after the last pack, kept free with the reserve
EXIT = {"complete": 0, "failed": 1, "usage": 2, "packages": 3, "archive": 4, "too_long": 5, "remain": 75}


class PieceError(Exception):
    """The piece cannot go on: one line, and the exit status ``code``."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified_tokens(archive: pathlib.Path, fingerprint_path: pathlib.Path,
                    data_dir: pathlib.Path) -> tuple[str, pathlib.Path]:
    """The token cache of ``archive`` unpacked under ``data_dir``, after checking its SHA-256 against the
    fingerprint's; (the fingerprint's data fingerprint, the token directory). ``PieceError`` (exit 4) if not."""
    from scaling.data.corpus_build import unpack_archive

    try:
        fingerprint = json.loads(fingerprint_path.read_text())
        expected = fingerprint["archive"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise PieceError(f"corpus fingerprint {fingerprint_path}: unreadable ({error})", EXIT["archive"]) from None
    if not archive.is_file():
        raise PieceError(f"corpus archive {archive}: no such file (copy tokens.tar.xz there, or give --corpus)",
                         EXIT["archive"])
    actual = sha256_file(archive)
    if actual != expected:
        raise PieceError(f"corpus archive {archive}: SHA-256 {actual[:16]}… is not the committed {expected[:16]}… "
                         f"({fingerprint_path}); refusing to train on another corpus", EXIT["archive"])
    target = data_dir / f"corpus-{actual[:16]}"
    if not (target / "tokens" / "metadata.json").exists():
        unpack_archive(archive, target)
    return fingerprint.get("data_fingerprint", ""), target / "tokens"


@dataclasses.dataclass
class Outcome:
    """What the piece did: the timing rows of the packs it trained, the packs it left, how it ended."""

    timing: list = dataclasses.field(default_factory=list)
    left: list = dataclasses.field(default_factory=list)
    trained: list = dataclasses.field(default_factory=list)
    failed: list = dataclasses.field(default_factory=list)
    stopped: bool = False


def timing_row(pack, records: list, wall: float, predicted: float, peak: float) -> dict:
    """One pack's row of the timing table, from its runs' records and the wall seconds it took here."""
    steps = max(record.steps for record in records)
    train = max(record.train_seconds or 0.0 for record in records) or wall
    tokens = sum(record.tokens for record in records)
    flops = plan_lib.pack_flops_per_step(pack)
    first = pack.runs[0]
    return {"pack": pack.label, "depth": first.depth, "width": first.width, "runs": len(pack.runs),
            "names": pack.names, "steps": steps, "tokens": tokens, "train_seconds": round(train, 3),
            "wall_seconds": round(wall, 3), "overhead_seconds": round(max(0.0, wall - train), 3),
            "predicted_seconds": round(predicted, 3), "tokens_per_second": round(tokens / train, 1) if train else None,
            "mfu": round(flops * steps / train / peak, 5) if train else None, "flops_per_step": flops,
            "step_seconds": train / steps if steps else None}


def left_packs(packs, model: plan_lib.SpeedModel, remaining: float) -> list[dict]:
    """The packs not started, each with its predicted seconds and the seconds that remained."""
    return [{"runs": p.names, "predicted_seconds": round(model.seconds(p), 1), "remaining_seconds": round(remaining, 1)}
            for p in packs]


def train_packs(packs, model: plan_lib.SpeedModel, deadline: float, workdir, say, peak: float) -> Outcome:
    """Train ``packs`` (cheapest first) as ``plan.next_pack`` picks them while one's predicted time fits before
    ``deadline`` (monotonic seconds, the reserve already taken off); a timer stops a pack still running then."""
    from sweeps.run_loop import RunLoop

    outcome, pending = Outcome(), list(packs)
    loop = RunLoop(workdir, say, show_progress=False, when_busy="exit")
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), lambda: setattr(loop.stop, "signal", "deadline"))
    timer.daemon = True
    timer.start()
    try:
        while pending:
            remaining = deadline - time.monotonic()
            pack = plan_lib.next_pack(pending, model, remaining, first=not outcome.timing)
            if pack is None:
                outcome.left = left_packs(pending, model, remaining)
                say(f"not started: the cheapest pack left would take ≈{model.seconds(pending[0]):.0f} s, "
                    f"{max(remaining, 0):.0f} s remain; {len(pending)} pack(s) left for the next piece")
                break
            pending.remove(pack)
            predicted = model.seconds(pack)
            say(f"pack {pack.label}: {', '.join(pack.names)} (≈{predicted:.0f} s predicted, "
                f"{remaining:.0f} s remain)")
            stopped = train_one_pack(loop, pack, workdir, outcome, predicted, remaining, peak, model)
            if stopped:  # the deadline (or a signal) stopped it: its runs are left too
                outcome.stopped = True
                outcome.left = left_packs([pack, *pending], model, deadline - time.monotonic())
                break
    finally:
        timer.cancel()
    return outcome


def train_one_pack(loop, pack, workdir, outcome: Outcome, predicted: float, remaining: float, peak: float,
                   model: plan_lib.SpeedModel) -> bool:
    """Train ``pack`` with ``loop``; record its runs' outcomes and, when all finished, its timing row (and tell
    ``model``). True when a stop ended it early."""
    from scaling.store import records as records_lib

    started = time.monotonic()
    code = loop.train_packs([pack], desc=pack.label)
    wall = time.monotonic() - started
    done = [records_lib.read_record(run.run_dir(workdir)) for run in pack.runs]
    status = {run.name: (r.status if r is not None else "none") for run, r in zip(pack.runs, done)}
    outcome.trained += [name for name, state in status.items() if state == "finished"]
    outcome.failed += [name for name, state in status.items() if state in ("failed", "diverged")]
    if all(state == "finished" for state in status.values()):
        row = {**timing_row(pack, done, wall, predicted, peak), "remaining_seconds": round(remaining, 1)}
        outcome.timing.append(row)
        model.add(plan_lib.Measured(row["flops_per_step"], row["step_seconds"], row["overhead_seconds"]))
    return code is not None


PROBE_SECONDS = 90.0  # the probe runs only when this much is left before the deadline (two compiles)


def run_probe(packs, size: int, model: plan_lib.SpeedModel, peak: float, deadline: float, say) -> dict | None:
    """Solo against packed (``sweeps.piece.probe``) at the cheapest pack's shape with ``size`` runs, when
    ``size`` > 1 and time allows; its two measurements go to ``model``. The row, or None."""
    if size < 2 or not packs or deadline - time.monotonic() < PROBE_SECONDS:
        return None
    from sweeps.piece.probe import solo_vs_packed

    config = packs[0].runs[0].config
    row = solo_vs_packed(config, size, peak)
    say(f"probe L{row['depth']}-d{row['width']}: alone {row['solo_tokens_per_second']:,.0f} tokens/s "
        f"(MFU {row['solo_mfu']:.2%}), {size} packed {row['packed_tokens_per_second']:,.0f} "
        f"(MFU {row['packed_mfu']:.2%}; ×{row['packed_per_run_over_solo']:.2f} per run)")
    model.add(plan_lib.Measured(row["flops_per_step"], row["solo_step_seconds"], row["solo_compile_seconds"]))
    model.add(plan_lib.Measured(size * row["flops_per_step"], row["packed_step_seconds"],
                                row["packed_compile_seconds"]))
    return row


def write_outputs(out: pathlib.Path, workdir: pathlib.Path, sweep_name: str, summary: dict, outcome: Outcome) -> None:
    """Records of every run this piece finished (``records/``; the others', with their ``error.log``, in
    ``unfinished/``, for diagnosis only), ``piece.json`` and ``timing.md`` under ``out``."""
    from scaling.cli import text_table

    sweep_dir = workdir / sweep_name
    for run_dir in sorted(p for p in sweep_dir.glob("*") if (p / "result.json").exists()):
        finished = json.loads((run_dir / "result.json").read_text()).get("status") == "finished"
        destination = out / ("records" if finished else "unfinished") / sweep_name / run_dir.name
        ledger_lib.copy_record(run_dir, destination)
        if (run_dir / "error.log").exists():
            shutil.copyfile(run_dir / "error.log", destination / "error.log")
    (out / "piece.json").write_text(json.dumps(summary, indent=1) + "\n")
    header = ["pack", "L", "d", "runs", "steps", "tokens", "train s", "wall s", "predicted s", "tokens/s", "MFU"]
    rows = [[r["pack"], r["depth"], r["width"], r["runs"], r["steps"], r["tokens"], f"{r['train_seconds']:.1f}",
             f"{r['wall_seconds']:.1f}", f"{r['predicted_seconds']:.1f}", f"{r['tokens_per_second']:,.0f}",
             f"{r['mfu']:.2%}"] for r in outcome.timing]
    lines = [f"# Piece timing: {summary['device']}, sweep {sweep_name}", "",
             f"budget {summary['budget_seconds']:.0f} s, wall {summary['wall_seconds']:.0f} s, "
             f"exit {summary['exit_code']}",
             "", text_table(header, rows), "", *probe_lines(summary.get("probe")), *solo_vs_packed(outcome.timing)]
    (out / "timing.md").write_text("\n".join(lines) + "\n")


def probe_lines(row: dict | None) -> list[str]:
    """The probe's line for the timing table (none without a probe)."""
    if not row:
        return []
    return [f"probe L{row['depth']}-d{row['width']} (random tokens): alone {row['solo_tokens_per_second']:,.0f} "
            f"tokens/s, MFU {row['solo_mfu']:.2%}, compiled in {row['solo_compile_seconds']:.1f} s; {row['runs']} packed "
            f"{row['packed_tokens_per_second']:,.0f} tokens/s, MFU {row['packed_mfu']:.2%}, compiled in "
            f"{row['packed_compile_seconds']:.1f} s (×{row['packed_per_run_over_solo']:.2f} per run)"]


def solo_vs_packed(timing: list) -> list[str]:
    """Lines comparing each shape's packed tokens/s per run with the same shape trained alone, where both ran."""
    by_shape: dict = {}
    for row in timing:
        by_shape.setdefault((row["depth"], row["width"]), {}).setdefault(row["runs"], row)
    lines = []
    for (depth, width), sizes in sorted(by_shape.items()):
        if 1 in sizes and len(sizes) > 1:
            solo = sizes[1]["tokens_per_second"]
            for k, row in sorted(sizes.items()):
                if k > 1:
                    per_run = row["tokens_per_second"] / k
                    lines.append(f"L{depth}-d{width}: packed {k} runs {per_run:,.0f} tokens/s per run, alone "
                                 f"{solo:,.0f} (×{per_run / solo:.2f})")
    return lines or ["solo vs packed: no shape trained both alone and packed in this piece"]


def scratch_workdir() -> pathlib.Path:
    return pathlib.Path(tempfile.mkdtemp(prefix="piece-runs-"))


def exit_code(outcome: Outcome, model: plan_lib.SpeedModel) -> int:
    """The piece's exit status (``EXIT``) from what it did."""
    if outcome.failed:
        return EXIT["failed"]
    if not outcome.left:
        return EXIT["complete"]
    first = outcome.left[0]
    if not outcome.trained and not outcome.stopped and first["predicted_seconds"] > model.settings.usable_seconds:
        return EXIT["too_long"]
    return EXIT["remain"]


def piece(args, started: float, installed: list[str], say=print) -> int:
    """The piece ``args`` describe (``python -m sweeps.piece run``), ``started`` at that monotonic second; its
    exit status. Raises ``PieceError`` for a wrong corpus or sweep file."""
    import os

    from scaling.entry import prepare_process

    if args.commit:  # the records name the commit this tree is (no git here); accept checks the source digest
        os.environ["SCALING_CODE_VERSION"] = args.commit[:12]
    prepare_process()
    import jax

    from scaling import hardware
    from sweeps import packing
    from sweeps.spec import load_sweep, with_overrides

    sweep = load_sweep(args.sweep_file)
    if not isinstance(sweep, plan_lib.PieceSweep):
        raise PieceError(f"{args.sweep_file}: its sweep is not a sweeps.piece.plan.PieceSweep", EXIT["usage"])
    settings = sweep.piece
    if not (args.fingerprint or settings.fingerprint) or not (args.ledger or settings.ledger):
        raise PieceError(f"{sweep.name} names no corpus fingerprint or ledger: give --fingerprint and --ledger",
                         EXIT["usage"])
    data_fingerprint, tokens = verified_tokens(args.corpus, args.fingerprint or REPO / settings.fingerprint,
                                               args.data_dir)
    sweep = with_overrides(sweep, ["wandb_mode=disabled", "checkpoint_every=1000000000", f"data.cache_dir={tokens}",
                                   *args.overrides])
    ledger_path = args.ledger or REPO / settings.ledger
    ledger = ledger_lib.read(ledger_path)
    done = ledger_lib.finished_ids(ledger)
    runs = sorted((r for r in sweep.expand().runs if r.run_id not in done), key=lambda r: (r.flops, r.run_id))
    device = jax.devices()[0].device_kind
    peak = hardware.mfu_peak_flops(sweep.base.peak_flops, sweep.base.model.compute_dtype, device)
    model = plan_lib.SpeedModel(settings, peak, ledger_lib.measured(ledger, device))
    packs = plan_lib.fitting(packing.plan_packs(runs, sweep.pack, lambda run: 0), model, settings.usable_seconds)
    say(f"piece of sweep {sweep.name} on {jax.device_count()} × {device}: {len(runs)} run(s) to train in "
        f"{len(packs)} pack(s), {len(done)} finished in {ledger_path.name}; budget {args.budget:.0f} s, "
        f"{time.monotonic() - started:.0f} s spent starting")
    workdir = scratch_workdir()
    deadline = started + args.budget - settings.reserve_seconds - FINISH_SECONDS
    first_on_card = not ledger_lib.measured(ledger, device)
    probe = run_probe(packs, args.probe if args.probe is not None else 4 * first_on_card, model, peak, deadline, say)
    outcome = train_packs(packs, model, deadline, workdir, say, peak)
    code = exit_code(outcome, model)
    summary = {"format": "piece-v1", "sweep": sweep.name, "stage": os.environ.get("GPU_DEPTH_STAGE", "1"),
               "sweep_file": str(args.sweep_file), "overrides": list(args.overrides), "commit": args.commit or "",
               "source_digest": ledger_lib.source_digest(REPO), "device": device, "devices": jax.device_count(),
               "jax": jax.__version__, "budget_seconds": args.budget, "exit_code": code,
               "archive_sha256": sha256_file(args.corpus), "data_fingerprint": data_fingerprint,
               "installed": installed, "speed_model": model.how, "trained": outcome.trained,
               "failed": outcome.failed, "left": outcome.left, "timing": outcome.timing, "probe": probe,
               "wall_seconds": round(time.monotonic() - started, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    write_outputs(args.out, workdir, sweep.name, summary, outcome)
    shutil.rmtree(workdir, ignore_errors=True)
    left = sum(len(p["runs"]) for p in outcome.left)
    say(f"trained {len(outcome.trained)} run(s), {len(outcome.failed)} failed, {left} left; records, piece.json "
        f"and timing.md in {args.out}; exit {code}")
    return code
