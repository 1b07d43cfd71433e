"""What the preflight expected of each run against what the run measured, for ``status``.

A run trained after a preflight keeps the preflight's estimate in its record (``estimated_step_seconds``,
``estimated_mfu``, ``estimate_source``; ``sweeps.preflight.estimate_store``) beside the trainer's own ``mfu`` over
its training time. The first runs on new hardware so show how far the estimate is off before the rest of
the sweep is paid for. Measured seconds per step are ``train_seconds / steps``: the steps with the
periodic logging, evaluations and checkpoints between them, so they lean slower than the step alone.
"""

from __future__ import annotations

from scaling.cli import fmt, text_table


def _ratio(measured, estimated):
    return measured / estimated if measured and estimated else None


def lines(states: list) -> list[str]:
    """A table of the runs whose record keeps a preflight estimate, estimate beside measurement; [] if none.
    ``states``: ``sweeps.state.RunState`` objects (the state module calls this one, not the other way)."""
    rows, sources = [], []
    for state in states:
        record = state.record or {}
        if record.get("estimated_step_seconds") is None and record.get("estimated_mfu") is None:
            continue
        steps, seconds = record.get("steps") or 0, record.get("train_seconds")
        measured_step = seconds / steps if steps and seconds else None
        rows.append([state.spec.name, state.status, fmt(record.get("estimated_step_seconds"), ".3g"),
                     fmt(measured_step, ".3g"), fmt(record.get("estimated_mfu"), ".1%"), fmt(record.get("mfu"), ".1%"),
                     fmt(_ratio(record.get("mfu"), record.get("estimated_mfu")), ".2f")])
        if record.get("estimate_source") and record["estimate_source"] not in sources:
            sources.append(record["estimate_source"])
    if not rows:
        return []
    header = ["run", "status", "est. s/step", "s/step", "est. MFU", "MFU", "MFU / est."]
    table = text_table(header, rows, align=("left", "left") + ("right",) * 5)
    return (["", "estimate against measurement (the preflight's, kept in each record; s/step measured as "
                 "train_seconds / steps, MFU the trainer's):", *table.splitlines()]
            + [f"estimates: {source}" for source in sources])
