"""A sweep's wandb: whether its runs can log to it here, and the sweep's own wandb run with the results table.

Each training run logs through ``scaling.run.track``; this module adds what belongs to the sweep as a whole.
"""

from __future__ import annotations

from sweeps.spec import Sweep
from sweeps.state import RunState, counts


def wandb_missing(sweep: Sweep) -> str | None:
    """Why the sweep's runs cannot log to wandb here (one line), or None: its ``wandb_mode`` needs wandb and
    wandb is not installed. Checked before any run starts, so that no run is recorded failed for it."""
    import importlib.util

    from scaling.run.track import wandb_mode

    mode = wandb_mode(sweep.base.wandb_mode)
    if mode == "disabled" or importlib.util.find_spec("wandb") is not None:
        return None
    return (f"wandb_mode={mode} needs wandb, which is not installed: pip install wandb, or add "
            "--set wandb_mode=disabled (run ids stay the same; metrics.jsonl keeps every metric)")


def log_sweep(sweep: Sweep, states: list[RunState], sweep_dir) -> None:
    """One wandb run of job_type "sweep" in the sweep's group: the sweep config and the results table.

    Opened only after the training runs are done, because wandb keeps one
    active run per process and the trainer's runs come first.
    """
    from scaling.run.track import finish_wandb_run, open_wandb_run

    run = open_wandb_run(sweep_dir, mode=sweep.base.wandb_mode, project=sweep.base.wandb_project, group=sweep.name,
                         job_type="sweep", name=f"{sweep.name}-sweep", id=f"sweep-{sweep.digest()}",
                         config=sweep.to_dict())
    if run is None:
        return
    import wandb

    columns = ["name", "run_id", "depth", "width", "params", "seed", "peak_lr", "status", "final_eval_loss"]
    table = wandb.Table(columns=columns, data=[[s.to_dict()[c] for c in columns] for s in states])
    run.log({"runs": table, **{f"runs_{status}": n for status, n in counts(states).items()}})
    finish_wandb_run(run, sweep_dir)
