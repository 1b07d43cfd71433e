"""Metric tracking: one seam for JSONL files, wandb and the progress bar.

Every metric always goes to ``metrics.jsonl`` in the run directory (one JSON
object per line, with ``step``). wandb is used on process 0 only; it runs
offline unless online mode is asked for *and* an API key is configured, so a
laptop or CI run never needs an account. The wandb run id is chosen by us and
stored with the checkpoint, so a resumed run continues the same wandb run.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

from etils import epath
from tqdm.auto import tqdm


def wandb_mode(requested: str) -> str:
    """Resolve ``auto`` to ``online`` only when an API key is available, else ``offline``."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    netrc = pathlib.Path.home() / ".netrc"
    has_key = bool(os.environ.get("WANDB_API_KEY")) or (netrc.exists() and "api.wandb.ai" in netrc.read_text())
    return "online" if has_key else "offline"


def new_wandb_id() -> str:
    """A fresh wandb run id (12 hex characters); stored with the checkpoint so resumes reuse it."""
    import secrets

    return secrets.token_hex(6)


class Tracker:
    """Writes metrics to JSONL (always), wandb (process 0, unless disabled) and a tqdm bar."""

    def __init__(self, run_dir, *, total_steps: int, start_step: int, config: dict, name: str,
                 group: str = "", project: str = "depth-width-scaling", mode: str = "auto",
                 wandb_id: str | None = None, is_main_process: bool = True, show_progress: bool = True):
        self.run_dir = epath.Path(run_dir)
        self.is_main = is_main_process
        self._metrics_path = self.run_dir / "metrics.jsonl"
        self._pending: list[str] = []
        self._local = "://" not in str(run_dir)  # gs://, s3://, memory:// ... are object stores
        self.wandb_run = None
        self.wandb_id = wandb_id
        self.mode = wandb_mode(mode)
        if self.is_main and self.mode != "disabled":
            import wandb

            self.wandb_run = _init_wandb(dict(
                project=project, group=group or None, name=name, id=wandb_id, resume="allow",
                config=config, mode=self.mode, dir=str(self.run_dir) if self._local else None,
                settings=wandb.Settings(silent=True, console="off")))
            self.wandb_id = self.wandb_run.id if self.wandb_run is not None else wandb_id
        self.bar = None
        if self.is_main and show_progress:
            self.bar = tqdm(total=total_steps, initial=start_step, desc=name or "train", unit="step",
                            dynamic_ncols=True, file=sys.stderr, mininterval=1.0)
        self._last_time = time.perf_counter()

    def log(self, step: int, metrics: dict) -> None:
        """Record ``metrics`` (floats) at ``step``: JSONL line, wandb, and progress-bar postfix."""
        if not self.is_main:
            return
        record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        self._pending.append(json.dumps(record))
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in record.items() if k != "step"}, step=int(step))
        if self.bar is not None:
            shown = {k: f"{record[k]:.4g}" for k in ("loss", "eval_loss", "tokens_per_second") if k in record}
            if shown:
                self.bar.set_postfix(shown, refresh=False)
        self.flush()

    def advance(self, steps: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(steps)

    def flush(self) -> None:
        if not self._pending:
            return
        text = "\n".join(self._pending) + "\n"
        if self._local:
            with self._metrics_path.open("a") as handle:
                handle.write(text)
        else:  # object stores cannot append: rewrite the whole file
            previous = self._metrics_path.read_text() if self._metrics_path.exists() else ""
            self._metrics_path.write_text(previous + text)
        self._pending.clear()

    def summary(self, values: dict) -> None:
        if self.wandb_run is not None:
            for key, value in values.items():
                self.wandb_run.summary[key] = _plain(value)

    def close(self, exit_code: int = 0) -> None:
        self.flush()
        if self.bar is not None:
            self.bar.close()
        if self.wandb_run is not None:
            self.wandb_run.finish(exit_code=exit_code)
            self.wandb_run = None


def _init_wandb(kwargs: dict, attempts: int = 6, wait_seconds: float = 5.0):
    """``wandb.init`` that survives a crashed predecessor.

    After a hard kill, the dead process's wandb service can hold the run id
    for a little while ("run ID ... is in use"). Retry for ~30 s, then carry
    on without wandb (metrics.jsonl still has everything) rather than lose
    the training run.
    """
    import wandb

    for attempt in range(attempts):
        try:
            return wandb.init(**kwargs)
        except Exception as error:  # noqa: BLE001 - wandb raises several private error types
            if "in use" not in str(error) or attempt == attempts - 1:
                print(f"warning: wandb disabled for this run: {error}", file=sys.stderr)
                return None
            time.sleep(wait_seconds)
    return None


def _plain(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value
