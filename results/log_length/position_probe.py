"""Probe: is the failure at length 1000 attention dilution, or the untrained position embeddings?

    PYTHONPATH=$PWD JAX_PLATFORMS=cpu python results/log_length/position_probe.py results/log_length
    python results/log_length/position_probe.py results/log_length --summary-only   # table from the .jsonl

With learned positions, a model trained on n bits has trained position
embeddings 0..n only; positions n+1..1000 keep their random N(0, 1)
initialisation. For each finished run picked (it needs the run's final
checkpoint, which is not committed: run the sweep first), this evaluates the
final parameters on the first ``--strings`` test strings of length 1000:

- ``as trained``: unchanged (what the run record reports, on fewer strings);
- ``untrained positions zeroed``: embeddings of positions > n set to zero, so
  those bits carry only their token embedding;
- ``at training length``: strings of length n (the in-distribution check).

Defaults: FIRST, every training length, seeds 0-2, 200 strings. Appends one
JSON line per run (accuracies in percent) to ``--out`` and prints a table of
mean ± std over seeds per (task, n, arm). A one-off diagnostic for the
README, not part of the sweep; it imports the trainer, so it needs JAX.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import jax
import numpy as np

from scaling.config import TrainConfig, from_dict
from scaling.data import pipeline as data
from scaling.model import mesh as mesh_lib, program as program_lib
from scaling.run import train
from scaling.store.checkpoints import Checkpoints


CONDITIONS = ("as trained", "untrained positions zeroed", "at training length")


def _accuracy(program, params, pipeline, strings: int, batch_size: int) -> tuple[float, float]:
    batches = pipeline.validation_batches(batch_size, strings // batch_size)
    metrics = program_lib.evaluate_metrics(program, params, batches, batch_size)
    return metrics["accuracy"], metrics["loss"] / np.log(2)


def probe(run_dir: Path, strings: int) -> dict:
    config = from_dict(TrainConfig, json.loads((run_dir / "config.json").read_text()))
    pipeline = data.build(config.data)
    config = train.resolve_config(config, pipeline)
    program = program_lib.build(config, mesh_lib.make_mesh(config.mesh), label_ids=pipeline.LABEL_TOKENS)
    # Restore from a copy: Checkpoints.restore_newest deletes checkpoints it cannot read back.
    with tempfile.TemporaryDirectory() as scratch:
        shutil.copytree(run_dir / "checkpoints", Path(scratch) / "checkpoints")
        checkpoints = Checkpoints(Path(scratch) / "checkpoints", 1, program.abstract_state)
        restored = checkpoints.restore_newest()
        checkpoints.close()
    if restored is None:
        raise ValueError(f"{run_dir}: no readable checkpoint to probe")
    params = restored[0]["params"]
    n = config.data.synthetic_max_length
    zeroed = jax.tree_util.tree_map(lambda x: x, params)
    table = np.asarray(params["position_embedding"]).copy()
    table[n + 1:] = 0.0
    zeroed["position_embedding"] = jax.numpy.asarray(table)
    short = data.build(dataclasses.replace(config.data, synthetic_eval_min_length=n, synthetic_eval_max_length=n))
    return {"name": config.name, "task": config.data.source, "n": n, "arm": config.model.attention_scale,
            "seed": config.seed, "as trained": _accuracy(program, params, pipeline, strings, config.batch_size),
            "untrained positions zeroed": _accuracy(program, zeroed, pipeline, strings, config.batch_size),
            "at training length": _accuracy(program, params, short, strings, config.batch_size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--tasks", nargs="+", default=["first"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[10, 30, 100, 300])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--strings", type=int, default=200, help="test strings per evaluation (multiple of 10)")
    parser.add_argument("--out", default="results/log_length/position_probe.jsonl",
                        help="one JSON line per probed run; runs already in it are not probed again")
    parser.add_argument("--summary-only", action="store_true", help="print the table of --out and stop")
    args = parser.parse_args()
    out = Path(args.out)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    done = {row["run_id"] for row in rows}
    for run_dir in [] if args.summary_only else sorted(Path(args.sweep_dir).glob("*/")):
        try:
            config = json.loads((run_dir / "config.json").read_text())
            record = json.loads((run_dir / "result.json").read_text())
        except (OSError, ValueError):
            continue
        if (record.get("status") != "finished" or record["run_id"] in done or config["data"]["source"] not in args.tasks
                or config["data"]["synthetic_max_length"] not in args.lengths or config["seed"] not in args.seeds
                or not (run_dir / "checkpoints").exists()):
            continue
        try:
            result = probe(run_dir, args.strings)
        except ValueError as error:
            print(f"skipped: {error}", flush=True)
            continue
        print(result["name"] + ": " + "; ".join(f"{key} {100 * result[key][0]:.1f}% / {result[key][1]:.2f} bits"
                                                for key in CONDITIONS), flush=True)
        row = {"run_id": record["run_id"], "strings": args.strings,
               **{k: result[k] for k in ("task", "n", "arm", "seed")},
               **{key: 100 * result[key][0] for key in CONDITIONS}}
        rows.append(row)
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
    if rows:
        print(summary(rows))


def summary(rows: list[dict]) -> str:
    """Markdown: mean ± std over seeds of the test accuracy (%) under each condition, per (task, n, arm)."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    lines = ["| task | train n | arm | seeds | " + " | ".join(f"{c} (%)" for c in CONDITIONS) + " |",
             "|---|---:|---|---:|" + "---:|" * len(CONDITIONS)]
    for (task, n, arm), cell in frame.groupby(["task", "n", "arm"], sort=True):
        values = " | ".join(f"{cell[c].mean():.1f} ± {cell[c].std(ddof=1):.1f}" if len(cell) > 1
                            else f"{cell[c].mean():.1f}" for c in CONDITIONS)
        lines.append(f"| {task.upper()} | {n} | {arm} | {len(cell)} | {values} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
