"""``python -m scaling.train eval`` and ``sample``: a trained run read back and used (scaling/run/restore.py,
scaling/run/evaluate.py, scaling/run/generate.py), on the session's tiny reference run (trained on one device)."""

from __future__ import annotations

import json
import math
import shutil

import jax
import numpy as np
import pytest

import tiny
from scaling import train as train_cli
from scaling.data.tokenizer import ByteTokenizer
from scaling.run import evaluate, generate, train
from scaling.run.restore import RunDirError, load_run

TEXT = ("Depth and width trade against each other at a fixed parameter budget. "
        "ZZZZ qqqq 1234567890 !!!! ~~~~ ")


@pytest.fixture(scope="module")
def reference(tiny_reference):
    """(run directory, its record, the run read back onto all 8 of the test process's devices)."""
    run_dir, record = tiny_reference
    return run_dir, record, load_run(run_dir)


@pytest.fixture(autouse=True)
def no_allocator_tuning(monkeypatch):
    monkeypatch.setenv("SCALING_MALLOC_TUNING", "0")  # the commands tune glibc; not this test process


def command(capsys, *argv) -> tuple[int, str, str]:
    """``python -m scaling.train ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        status = train_cli.main(list(argv))
    except SystemExit as exit:  # argparse's errors
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


# ---------------------------------------------------------------------------
# eval


def test_eval_on_the_runs_own_validation_data_is_its_final_eval_loss(reference, capsys):
    run_dir, record, _ = reference
    status, out, err = command(capsys, "eval", str(run_dir), "--json")
    assert status == 0, err
    result = json.loads(out)
    assert result["step"] == record.steps == tiny.STEPS
    assert math.isfinite(result["loss"])
    # Trained on one device, read back onto eight: the same loss up to float summation order.
    assert result["loss"] == pytest.approx(record.final_eval_loss, rel=1e-5)
    assert result["tokens"] == tiny.config().batch_size * tiny.config().data.seq_len


def test_eval_restores_onto_other_meshes_and_device_counts(reference, eight_devices):
    run_dir, record, _ = reference
    one = evaluate.evaluate_run(load_run(run_dir, devices=tiny.one_device()), ["validation"])
    # fsdp over 8 devices splits the width-16 parameters eight ways: a different layout from the checkpoint's.
    sharded_run = load_run(run_dir, devices=eight_devices, overrides=("mesh.data=1", "mesh.fsdp=8"))
    embedding = sharded_run.params["token_embedding"]["embedding"]
    assert len({str(shard.index) for shard in embedding.addressable_shards}) == 8
    sharded = evaluate.evaluate_run(sharded_run, ["validation"])
    # 3 devices do not divide the batch of 8: it is padded to 9 rows that weigh nothing.
    three = evaluate.evaluate_run(load_run(run_dir, devices=eight_devices[:3]), ["validation"])
    for result in (one, sharded, three):
        assert result["loss"] == pytest.approx(record.final_eval_loss, rel=1e-5)
        assert result["tokens"] == 8 * 32


def test_eval_on_other_text_gives_another_finite_loss_and_bits_per_byte(reference, tmp_path, capsys):
    run_dir, record, _ = reference
    text_file = tmp_path / "other.txt"
    text_file.write_text(TEXT)
    status, out, err = command(capsys, "eval", str(run_dir), "--data", str(text_file), "--json")
    assert status == 0, err
    result = json.loads(out)
    assert math.isfinite(result["loss"]) and abs(result["loss"] - record.final_eval_loss) > 1e-3
    # Every byte after the first and the closing end-of-document token are predicted once.
    size = len(TEXT.encode())
    assert result["tokens"] == size
    # Bits per byte: the summed loss (the end-of-document token's included) in bits over the predicted bytes.
    assert result["bits_per_byte"] == pytest.approx(result["loss"] * size / math.log(2) / (size - 1), rel=1e-6)
    # The human-readable line says the same.
    status, out, _ = command(capsys, "eval", str(run_dir), "--data", str(text_file))
    assert status == 0 and "nats/token" in out and "bits/byte" in out and len(out.strip().splitlines()) == 1


def test_a_jsonl_file_is_one_document_per_line(reference, tmp_path):
    _, _, run = reference
    lines = tmp_path / "docs.jsonl"
    lines.write_text(json.dumps({"body": "first document"}) + "\n\n" + json.dumps({"body": "second"}) + "\n")
    result = evaluate.evaluate_run(run, [str(lines)], text_field="body")
    assert result["tokens"] == len("first document") + 1 + len("second") + 1 - 1
    with pytest.raises(ValueError, match="no 'text' field"):
        evaluate.evaluate_run(run, [str(lines)])


def test_text_windows_predict_every_token_after_the_first_once():
    tokenizer = ByteTokenizer()
    texts = ["abcdefghij", "klmnop"]  # 18 tokens with the two end-of-document ones: 17 targets, 5 windows of 4
    windows = evaluate.text_windows(texts, tokenizer, eos_id=257, pad_id=256, seq_len=4)
    stream = np.concatenate([tokenizer.encode("abcdefghij"), [257], tokenizer.encode("klmnop"), [257]])
    assert windows["inputs"].shape == (5, 4)
    weights = windows["weights"].astype(bool)
    assert weights.sum() == len(stream) - 1
    assert windows["targets"][weights].tolist() == stream[1:].tolist()
    # Real inputs are the stream in order (its last token too, when a window has room for it).
    real_inputs = windows["inputs"][windows["input_mask"].astype(bool)].tolist()
    assert real_inputs == stream.tolist()
    # The last window is the short one: padding only there.
    assert weights[:-1].all() and not weights[-1].all()


def test_eval_batches_limits_a_file(reference, tmp_path):
    _, _, run = reference
    text_file = tmp_path / "LONG"  # any file but .jsonl, .json or .parquet is plain text
    text_file.write_text(TEXT * 10)
    size = len(TEXT.encode()) * 10  # bytes; with the end-of-document token as many targets
    every = evaluate.evaluate_run(run, [str(text_file)])
    first = evaluate.evaluate_run(run, [str(text_file)], batches=2)
    assert every["batches"] == math.ceil(math.ceil(size / 32) / 8) > 2 and first["batches"] == 2
    assert every["tokens"] == size
    assert first["tokens"] == 2 * 8 * 32 < every["tokens"]


# ---------------------------------------------------------------------------
# sample


def reference_greedy(run, prompt_ids, new_tokens: int) -> list[int]:
    """Greedy decoding written plainly: the model on the whole (last max_seq_len tokens of the) context,
    every step, at the context's own length."""
    from scaling.model.transformer import Transformer

    apply = jax.jit(Transformer(run.config.model).apply)
    params = jax.device_get(run.params)
    context, out = list(prompt_ids), []
    for _ in range(new_tokens):
        window = np.asarray(context[-run.config.model.max_seq_len:], np.int32)[None]
        logits = np.array(apply({"params": params}, window)[0, -1])
        logits[[run.pad_id, run.mask_id, run.cls_id]] = -np.inf
        out.append(int(np.argmax(logits)))
        context.append(out[-1])
    return out


def test_greedy_gives_max_new_tokens_tokens_and_slides_past_the_context(reference):
    _, _, run = reference
    prompt = generate.encode_prompt(run, "Depth and width trade again")
    # 27 prompt tokens + 9 new ones: past the 32 positions of max_seq_len, so the context slides.
    assert len(prompt) == 27 and run.config.model.max_seq_len == 32
    new = generate.generate(run, prompt, generate.Sampling(max_new_tokens=9, temperature=0.0))
    assert new.shape == (9,)
    assert new.tolist() == reference_greedy(run, prompt, 9)
    # top-k 1 is greedy whatever the temperature and seed.
    top1 = generate.generate(run, prompt, generate.Sampling(max_new_tokens=9, temperature=2.0, top_k=1, seed=5))
    assert top1.tolist() == new.tolist()


def test_sampling_is_deterministic_for_a_seed_and_differs_between_seeds(reference):
    _, _, run = reference
    prompt = generate.encode_prompt(run, "")  # an empty prompt starts a new document
    assert prompt.tolist() == [run.eos_id]
    draws = [generate.generate(run, prompt, generate.Sampling(max_new_tokens=24, temperature=1.0, top_k=50,
                                                              seed=seed)).tolist() for seed in (1, 1, 2)]
    assert draws[0] == draws[1]
    assert draws[0] != draws[2]
    assert all(token not in (run.pad_id, run.mask_id, run.cls_id) for token in draws[0] + draws[2])
    # top-k 50: every token drawn is among the 50 most likely at its step; checked for the first one.
    from scaling.model.transformer import Transformer

    logits = np.asarray(Transformer(run.config.model).apply({"params": jax.device_get(run.params)},
                                                            prompt[None])[0, -1])
    assert draws[0][0] in np.argsort(logits)[-50:]


def test_sample_command_prints_the_prompt_and_its_continuation(reference, capsys):
    run_dir, _, run = reference
    status, out, err = command(capsys, "sample", str(run_dir), "--prompt", "The ", "--max-new-tokens", "12",
                               "--greedy", "--json")
    assert status == 0, err
    result = json.loads(out)
    assert len(result["new_tokens"]) == 12 and result["temperature"] == 0.0
    assert result["completion"] == generate.decode(run, result["new_tokens"])
    status, text, _ = command(capsys, "sample", str(run_dir), "--prompt", "The ", "--max-new-tokens", "12",
                              "--greedy")
    assert status == 0 and text == "The " + result["completion"] + "\n"


def test_text_made_a_chunk_at_a_time_is_the_text_made_at_once(reference):
    _, _, run = reference
    prompt = generate.encode_prompt(run, "The ")
    sampling = generate.Sampling(max_new_tokens=23, temperature=1.0, top_k=20, seed=3)
    chunks = list(generate.generate_chunks(run, prompt, sampling, chunk=5))
    assert [len(c) for c in chunks] == [5, 5, 5, 5, 3]
    assert np.concatenate(chunks).tolist() == list(generate.generate_chunks(run, prompt, sampling, chunk=64))[0].tolist()


def test_sample_prints_each_chunk_as_it_comes_and_holds_back_a_split_character(reference, capsys):
    _, _, run = reference
    seen = []

    def chunks():
        yield np.array(list(b"ab") + [0xC3])  # "ab" and the first byte of "é"
        seen.append(capsys.readouterr().out)
        yield np.array([0xA9] + list(b"c"))

    generate._stream(run, "P:", chunks())
    assert seen == ["P:ab"] and capsys.readouterr().out == "éc\n"


def test_sample_says_when_the_text_outgrows_the_context(reference, capsys):
    run_dir, _, run = reference
    window = run.config.model.max_seq_len
    status, out, err = command(capsys, "sample", str(run_dir), "--prompt", "The ", "--max-new-tokens",
                               str(window + 5), "--greedy")
    assert status == 0 and f"sees the last {window} tokens" in err and "window slides" in err
    status, out, err = command(capsys, "sample", str(run_dir), "--prompt", "The ", "--max-new-tokens", "5", "--greedy")
    assert status == 0 and "slides" not in err


def test_decode_shows_an_end_of_document_token_as_a_blank_line(reference):
    _, _, run = reference
    ids = list(b"ab") + [run.eos_id] + list(b"c")
    assert generate.decode(run, ids) == "ab\n\nc"


@pytest.mark.parametrize("argv, message", [
    (["sample", "RUN", "--temperature", "-1"], "temperature=-1.0 is invalid"),
    (["sample", "RUN", "--top-k", "0"], "must be 1 or more"),
    (["eval", "RUN", "--set", "model.depth=3"], "only data.*, mesh.*"),
    (["eval", "RUN", "--data", "validation", "notes.txt"], "stand alone"),
    (["eval", "RUN", "--data", "missing.md"], "missing.md: no such file"),
])
def test_bad_options_give_one_line(reference, capsys, argv, message):
    run_dir, _, _ = reference
    status, out, err = command(capsys, *[str(run_dir) if a == "RUN" else a for a in argv])
    assert status == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------
# a sweep's run by its name


def test_a_sweeps_run_is_found_by_its_name(reference, tmp_path, capsys):
    run_dir, _, _ = reference
    shutil.copytree(run_dir, tmp_path / "smoke" / "0123456789ab")  # the folder: a hash of the config
    status, out, err = command(capsys, "sample", str(tmp_path / "smoke" / "tiny"), "--max-new-tokens", "3",
                               "--greedy", "--json")
    assert status == 0, err
    assert json.loads(out)["run_dir"] == str(tmp_path / "smoke" / "0123456789ab")
    status, out, err = command(capsys, "eval", str(tmp_path / "smoke" / "tiny"), "--batches", "1", "--json")
    assert status == 0 and json.loads(out)["run_dir"] == str(tmp_path / "smoke" / "0123456789ab"), err


def test_a_misspelt_or_ambiguous_run_name_gives_one_line_naming_the_nearest(reference, tmp_path, capsys):
    run_dir, _, _ = reference
    shutil.copytree(run_dir, tmp_path / "smoke" / "0123456789ab")
    status, out, err = command(capsys, "sample", str(tmp_path / "smoke" / "tinny"))
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "no run in" in err and "nearest run names: tiny" in err
    shutil.copytree(run_dir, tmp_path / "smoke" / "ba9876543210")  # a second run of that name, unlisted
    status, out, err = command(capsys, "eval", str(tmp_path / "smoke" / "tiny"))
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "2 runs" in err and "0123456789ab" in err and "ba9876543210" in err
    # The sweep's own listing says which of them is the run of the sweep as it is now.
    (tmp_path / "smoke" / "sweep.json").write_text(json.dumps({"runs": [{"name": "tiny",
                                                                        "run_id": "ba9876543210"}]}))
    from scaling.store.rundir import resolve_run_dir

    assert str(resolve_run_dir(tmp_path / "smoke" / "tiny")) == str(tmp_path / "smoke" / "ba9876543210")


# ---------------------------------------------------------------------------
# run directories that cannot be used


@pytest.mark.parametrize("use", ["eval", "sample"])
def test_a_directory_without_config_json_gives_one_line(tmp_path, capsys, use):
    status, out, err = command(capsys, use, str(tmp_path))
    assert status == 2 and out == ""
    assert "no config.json" in err and str(tmp_path) in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("use", ["eval", "sample"])
def test_a_run_without_checkpoints_gives_one_line(reference, tmp_path, capsys, use):
    run_dir, _, _ = reference
    untrained = tmp_path / "untrained"
    untrained.mkdir()
    shutil.copy(run_dir / "config.json", untrained / "config.json")
    status, out, err = command(capsys, use, str(untrained))
    assert status == 2 and out == ""
    assert "no checkpoints" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(RunDirError, match="no checkpoints"):
        load_run(untrained)


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(reference, tmp_path, capsys):
    run_dir, record, _ = reference
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    for array_file in (copy / "checkpoints" / str(tiny.STEPS) / "state").rglob("d/*"):
        array_file.write_bytes(b"damaged")
    run = load_run(copy)
    assert run.step == tiny.STEPS - tiny.CHECKPOINT_EVERY
    assert "does not read back" in capsys.readouterr().err
    # Nothing in the run directory was moved or written.
    assert (copy / "checkpoints" / str(tiny.STEPS)).is_dir() and not (copy / "checkpoints-set-aside").exists()


def test_sampling_computes_the_runs_parametrization():
    """A CompleteP run's residual branches are scaled (base depth 8, depth 1: ×8): sampling must use the
    function the run learned, not the standard parametrization's."""
    import dataclasses
    from types import SimpleNamespace

    from scaling.model import parametrization
    from scaling.model.transformer import Transformer

    base = tiny.config()
    config = dataclasses.replace(base, optim=dataclasses.replace(base.optim, parametrization="completep",
                                                                           base_depth=8),
                                 model=dataclasses.replace(base.model, vocab_size=260))
    multipliers = parametrization.multipliers(config.optim, config.model)
    assert multipliers.residual != 1.0
    right, wrong = Transformer(config.model, multipliers=multipliers), Transformer(config.model)
    window = config.model.max_seq_len
    params = right.init(jax.random.PRNGKey(0), np.zeros((1, window), np.int32))["params"]
    params = jax.tree_util.tree_map(lambda leaf: getattr(leaf, "value", leaf), params,
                                    is_leaf=lambda leaf: hasattr(leaf, "value"))
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    params = jax.tree_util.tree_unflatten(tree, [x + 0.5 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    run = SimpleNamespace(config=config, params=params, pad_id=256, eos_id=257, mask_id=258, cls_id=259,
                          vocab_size=260, program=SimpleNamespace(mesh=jax.sharding.Mesh(np.array(jax.devices()[:1]),
                                                                                         ("data",))))
    prompt = np.array(list(b"The "), np.int32)
    sampled = generate.generate(run, prompt, generate.Sampling(max_new_tokens=12, temperature=1.0, seed=4))

    def draw(model):  # what sampling computes, written out: softmax(logits) drawn with the step's key
        context, key = list(prompt), jax.random.PRNGKey(4)
        for index in range(12):
            padded = np.full((1, window), run.pad_id, np.int32)
            padded[0, :len(context)] = context
            logits = np.array(model.apply({"params": params}, padded))[0, len(context) - 1]
            logits[[run.pad_id, run.mask_id, run.cls_id]] = -np.inf
            context.append(int(jax.random.categorical(jax.random.fold_in(key, index), logits)))
        return context[len(prompt):]

    assert draw(right) != draw(wrong)  # the multipliers matter here, so the test can tell
    assert sampled.tolist() == draw(right)
