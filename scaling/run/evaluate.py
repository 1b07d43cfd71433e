"""The loss of a trained run on other data: ``python -m scaling.train eval RUN_DIR --data ...``.

The run's newest checkpoint is read back onto this machine's devices
(``scaling.run.restore``) and evaluated as the trainer evaluates (the same
compiled eval step, ``scaling.model.program``) on one of:

- ``--data validation`` (the default) or ``--data train``: a split of the
  run's own data config, through the trainer's pipeline (``scaling.data.pipeline``).
  ``--set data.KEY=VALUE`` changes that config first (another corpus, hub
  dataset, local files, sequence length; not the tokenizer). The validation
  split is the trainer's fixed validation set, so with the run's own config
  and its ``eval_batches`` (the default ``--batches``) the loss is the
  run's final eval loss. ``train`` reads the run's first training batches.
- ``--data FILE [FILE ...]``: text files, local or ``gs://`` (``.jsonl``/
  ``.json``: one document per line, its ``--text-field``; ``.parquet``: that
  column; any other file, ``.txt``, ``.md`` or none, is plain UTF-8 text and
  one document). Every document is
  followed by the end-of-document token, as in training, and the stream is
  cut into windows of ``data.seq_len + 1`` tokens at a stride of
  ``seq_len`` (the last one shorter, its missing positions weighing 0), so
  every token after the first is predicted exactly once. ``--batches``
  evaluates only the first batches.

Reported: the mean loss in nats per predicted token (classification tasks:
per label, with accuracy) and, for a causal model with the byte tokenizer,
bits per byte: the summed loss of every predicted token (end-of-document
tokens included) in bits, over the number of predicted bytes.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from scaling import cli
from scaling.config import CLASSIFICATION_SOURCES

DATA_SPLITS = ("validation", "train")
RECORD_SUFFIXES = (".jsonl", ".json", ".parquet")  # one document per row; any other file is plain text


def read_documents(path, text_field: str = "text") -> list[str]:
    """The documents of one file (local or URI): ``.jsonl`` lines and ``.parquet`` rows give one document
    each, from ``text_field``; any other file is UTF-8 text, one document. Empty documents are dropped."""
    import io

    from etils import epath

    path = epath.Path(path)
    suffix = path.suffix.lower()
    if not path.exists():
        raise ValueError(f"--data {path}: no such file (give text files, or one of {', '.join(DATA_SPLITS)})")
    if path.is_dir():
        raise ValueError(f"--data {path}: is a directory; give text files")
    if suffix not in RECORD_SUFFIXES:
        try:
            return [text for text in [path.read_text()] if text]
        except UnicodeDecodeError:
            raise ValueError(f"--data {path}: not UTF-8 text") from None
    if suffix == ".parquet":
        import pandas as pd

        rows = pd.read_parquet(io.BytesIO(path.read_bytes()))
        if text_field not in rows.columns:
            raise ValueError(f"--text-field {text_field!r} is not a column of {path}: columns are {list(rows.columns)}")
        return [text for text in rows[text_field].tolist() if text]
    texts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} line {number}: not JSON ({error.msg})") from None
        if not isinstance(row, dict) or text_field not in row:
            raise ValueError(f"{path} line {number}: no {text_field!r} field (choose one with --text-field)")
        if row[text_field]:
            texts.append(row[text_field])
    return texts


def text_windows(texts: list[str], tokenizer, eos_id: int, pad_id: int, seq_len: int) -> dict[str, np.ndarray]:
    """Every document followed by ``eos_id``, cut into windows of ``seq_len + 1`` tokens at stride
    ``seq_len``: ``inputs``/``targets`` int32 [windows, seq_len]; ``weights`` and ``input_mask`` are 1 on
    real targets and inputs and 0 on the last window's padding."""
    stream = np.concatenate([piece for ids in tokenizer.encode_batch(texts)
                             for piece in (ids.astype(np.int32), np.array([eos_id], np.int32))])
    if len(stream) < 2:
        raise ValueError("the text is too short: it needs at least one token to predict")
    count = -(-(len(stream) - 1) // seq_len)
    padded = np.full(count * seq_len + 1, pad_id, np.int32)
    padded[:len(stream)] = stream
    starts = np.arange(count) * seq_len
    windows = padded[starts[:, None] + np.arange(seq_len + 1)]
    real = (starts[:, None] + np.arange(seq_len + 1) < len(stream)).astype(np.float32)
    return {"inputs": windows[:, :-1], "targets": windows[:, 1:], "weights": real[:, 1:],
            "input_mask": real[:, :-1]}


def _batches_of(examples: dict[str, np.ndarray], batch_size: int, limit: int | None) -> list[dict]:
    total = len(examples["inputs"])
    batches = [{key: value[start:start + batch_size] for key, value in examples.items()}
               for start in range(0, total, batch_size)]
    return batches[:limit] if limit else batches


def _padded(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """``batch`` filled up to ``rows`` rows with copies of its first row that weigh 0 and are masked out
    (``input_mask`` 0, so a masked LM never picks a position there to predict)."""
    missing = rows - len(batch["inputs"])
    if missing <= 0:
        return batch
    filled = {key: np.concatenate([value, np.repeat(value[:1], missing, axis=0)]) for key, value in batch.items()}
    filled["weights"][-missing:] = 0.0
    filled["input_mask"][-missing:] = 0.0
    return filled


def evaluate_batches(run, batches: list[dict]) -> dict:
    """Sum the run's eval step over ``batches`` (dicts of numpy [rows, length] arrays, at most
    ``run.config.batch_size`` rows each; fewer are padded with rows weighing 0): ``loss`` in nats per
    predicted token, ``tokens`` predicted, ``accuracy`` (classification tasks), and ``bits_per_byte``
    (None unless ``run.byte_level`` and causal)."""
    import jax

    from scaling.model import mesh as mesh_lib

    program, rows = run.program, run.config.batch_size
    loss_sum, tokens, correct, byte_targets = 0.0, 0.0, 0.0, 0
    for index, batch in enumerate(batches):
        batch = _padded(batch, rows)
        placed = mesh_lib.global_batch(batch, program.mesh, rows)
        # The trainer's key per validation batch, so a masked LM masks its validation set as in training.
        summed, counted, right = program.eval_step(run.params, placed, jax.random.PRNGKey(10_000 + index))
        loss_sum, tokens, correct = loss_sum + float(summed), tokens + float(counted), correct + float(right)
        byte_targets += int(((batch["targets"] < 256) & (batch["weights"] > 0)).sum())
    classification = run.config.data.source in CLASSIFICATION_SOURCES
    causal_bytes = run.byte_level and run.config.model.objective == "causal" and not classification
    return {"loss": loss_sum / max(tokens, 1.0), "tokens": int(tokens), "batches": len(batches),
            "accuracy": correct / max(tokens, 1.0) if classification else None,
            "bits_per_byte": loss_sum / math.log(2) / byte_targets if causal_bytes and byte_targets else None}


def evaluate_run(run, data: list[str], *, batches: int | None = None, text_field: str = "text") -> dict:
    """``evaluate_batches`` on ``data``: ``["validation"]`` or ``["train"]`` (a split of the run's data
    config) or text files (see the module docstring); ``batches`` limits how many are evaluated
    (a split's default: the run's ``eval_batches``). Adds ``data`` (what was read) and ``step``."""
    config = run.config
    if len(data) == 1 and data[0] in DATA_SPLITS:
        from scaling.data import pipeline as data_lib

        pipeline = data_lib.build(config.data)
        count = batches or config.eval_batches
        if data[0] == "validation":
            chosen = pipeline.validation_batches(run.batch_size, count)
        else:
            chosen = [pipeline.train_batch(config.seed, step, run.batch_size) for step in range(count)]
        described = f"the {data[0]} split of the run's data ({config.data.source})"
    else:
        if any(name in DATA_SPLITS for name in data):
            raise ValueError(f"--data: {' or '.join(DATA_SPLITS)} stand alone, not beside files")
        if config.data.source in CLASSIFICATION_SOURCES:
            raise ValueError(f"--data FILE: the run learned the {config.data.source} classification task, "
                             "not text; evaluate it with --data validation")
        texts = [text for path in data for text in read_documents(path, text_field)]
        if not texts:
            raise ValueError(f"--data {' '.join(data)}: no text")
        windows = text_windows(texts, run.tokenizer, run.eos_id, run.pad_id, config.data.seq_len)
        chosen = _batches_of(windows, run.batch_size, batches)
        described = " ".join(data)
    return {"run_dir": str(run.run_dir), "step": run.step, "data": described, **evaluate_batches(run, chosen)}


# ---------------------------------------------------------------------------
# Command line


def parser(prog: str) -> argparse.ArgumentParser:
    """The ``eval`` command's parser (``prog``: how the user started it)."""
    result = cli.Parser(prog=prog, description="Mean loss (nats per token; bits per byte for byte-level "
                        "causal models) of a run's newest checkpoint on its own or other data.",
                        epilog="Example: python -m scaling.train eval runs/tiny --data notes.txt")
    result.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (local or gs://) holding config.json "
                        "and checkpoints/")
    result.add_argument("--data", nargs="+", default=["validation"], metavar="SPLIT_OR_FILE",
                        help="validation (default) or train: a split of the run's data config; or files, local "
                             "or gs:// (.jsonl and .parquet: a document per row; any other: plain text)")
    result.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="change the run's data config, batch or mesh before reading, e.g. "
                             "data.source=local, data.paths=a.txt, data.seq_len=64, mesh.fsdp=2 (repeatable)")
    result.add_argument("--batches", type=cli.positive_int, help="evaluate at most this many batches (a split's "
                                                             "default: the run's eval_batches)")
    result.add_argument("--batch-size", type=cli.positive_int, help="sequences per batch (default: the run's)")
    result.add_argument("--text-field", default="text", help="the text column of .jsonl/.parquet files (text)")
    result.add_argument("--json", action="store_true", help="print one JSON object")
    return result


def main(argv=None, prog: str = "python -m scaling.train eval") -> int:
    """Entry point of ``eval``: prints the loss; 2 with one line on stderr for unusable input."""
    return cli.run_dir_command(parser(prog), argv, _evaluate)


def _evaluate(args) -> int:
    from scaling.run.restore import load_run

    run = load_run(args.run_dir, overrides=tuple(args.overrides), batch_size=args.batch_size)
    result = evaluate_run(run, args.data, batches=args.batches, text_field=args.text_field)
    if args.json:
        print(json.dumps(result))
        return 0
    extra = f", {result['bits_per_byte']:.4f} bits/byte" if result["bits_per_byte"] is not None else ""
    extra += f", accuracy {result['accuracy']:.4f}" if result["accuracy"] is not None else ""
    print(f"{result['run_dir']} (step {result['step']}): loss {result['loss']:.4f} nats/token{extra} over "
          f"{result['tokens']:,} predicted tokens in {result['batches']} batches of {result['data']}")
    return 0
