"""Tests of the data pipeline (issue 3): corpus, sources, tokenizers, packing,
order and resume, multi-host slices, synthetic tasks and the CLI."""

import dataclasses
import json
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import helpers
from scaling.config import DataConfig
from scaling.data import corpus, pipeline as data, token_cache
from scaling.data.tokenizer import ByteTokenizer, load_hf, train_bpe

# Token caches built on first use go under each test's directory (conftest.py).
pytestmark = pytest.mark.usefixtures("own_cache_home")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A token cache of the built-in corpus, built once for the module."""
    directory = tmp_path_factory.mktemp("data-cache")
    token_cache.build_cache(DataConfig(), directory)
    return directory


@pytest.fixture(scope="module")
def builtin(cache_dir):
    return data.build(DataConfig(cache_dir=str(cache_dir)))


# Documents with multi-byte characters, blank-line free so that they survive
# being written as paragraphs of a text file.
DOCS = [f"Document {i}: caf\u00e9 \u2014 {'word ' * (i % 7)}\u00fcber {i * i} \U0001f600 end." for i in range(60)]


def local_config(tmp_path, kind, docs=DOCS, **overrides):
    """Write ``docs`` as one local file of ``kind`` and return its DataConfig."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    if kind == "txt":
        path = tmp_path / "corpus.txt"
        path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    elif kind == "jsonl":
        path = tmp_path / "corpus.jsonl"
        path.write_text("".join(json.dumps({"body": d, "n": i}) + "\n" for i, d in enumerate(docs)),
                        encoding="utf-8")
    else:
        path = tmp_path / "corpus.parquet"
        pq.write_table(pa.table({"body": docs, "n": list(range(len(docs)))}), path)
    field = "text" if kind == "txt" else "body"
    options = dict(source="local", paths=(str(path),), text_field=field, seq_len=8, validation_fraction=0.2)
    return DataConfig(**{**options, **overrides}), path


def byte_stream(texts, eos_id):
    return np.concatenate([np.concatenate([np.frombuffer(t.encode(), np.uint8).astype(np.int64), [eos_id]])
                           for t in texts])


# ---------------------------------------------------------------------------
# Built-in corpus


def test_builtin_corpus_holds_at_least_5_mb_of_prose(builtin):
    stats = builtin.stats
    assert stats["train_bytes"] + stats["validation_bytes"] >= 5_000_000
    assert stats["train_documents"] > 1000 and stats["validation_documents"] > 20
    text = builtin.tokenizer.decode(builtin.train_tokens[:200_000][builtin.train_tokens[:200_000] < 256])
    words = text.split()
    assert sum(w.lower() in {"the", "and", "of", "to", "is"} for w in words) > 0.08 * len(words)  # English


def test_train_and_validation_share_no_document():
    texts = [text for _, text in corpus.builtin_documents()]
    train, validation = corpus.split_documents(texts, 0.02)
    assert len(train) + len(validation) == len(texts)
    assert not set(train) & set(validation)
    assert 0.01 < len(validation) / len(texts) < 0.04
    # Duplicated texts land on the same side, so they cannot leak.
    train2, validation2 = corpus.split_documents(texts[:300] + texts[:300], 0.2)
    assert not set(train2) & set(validation2)


def test_two_fresh_processes_build_identical_splits(builtin, tmp_path):
    processes = [helpers.start(helpers.module_command("scaling.data", "stats", "--source", "builtin", "--json"),
                               env=helpers.with_checkout(XDG_CACHE_HOME=str(tmp_path / f"cache{i}")))
                 for i in range(2)]
    results = helpers.finish(processes, timeout=120)
    assert [done.returncode for done in results] == [0, 0], results
    first, second = (json.loads(done.stdout) for done in results)
    assert first == second
    assert first["corpus_sha256"] == builtin.stats["corpus_sha256"]
    assert first["fingerprint"] == builtin.fingerprint
    for key in ("train_bytes", "validation_bytes", "train_documents", "validation_documents"):
        assert first[key] == builtin.stats[key]


def test_builtin_rebuild_uses_the_token_cache(builtin, own_cache_home, capsys):
    first = data.build(DataConfig())  # data.cache_dir unset: tokenised into the local cache on first use
    directory = own_cache_home / f"tokens-{builtin.fingerprint[:32]}"
    shards = sorted(directory.glob("*.npy"))
    assert [p.name for p in shards] == ["train-00000.npy", "validation-00000.npy"]
    written = [p.stat().st_mtime_ns for p in shards]
    again = data.build(DataConfig())
    assert [p.stat().st_mtime_ns for p in shards] == written  # read back, not rebuilt
    assert "token cache" not in capsys.readouterr().err
    assert again.fingerprint == first.fingerprint == builtin.fingerprint
    np.testing.assert_array_equal(np.asarray(again.train_tokens), np.asarray(builtin.train_tokens))


@pytest.mark.parametrize("damage", ["truncated", "zeros", "missing"])
def test_a_damaged_token_cache_is_rebuilt_not_trained_on(builtin, own_cache_home, damage, capsys):
    data.build(DataConfig())
    shard = own_cache_home / f"tokens-{builtin.fingerprint[:32]}" / "train-00000.npy"
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    elif damage == "zeros":  # a well-formed file of the right size holding the wrong tokens
        np.save(shard, np.zeros(len(builtin.train_tokens), dtype=np.uint16))
    else:
        shard.unlink()
    rebuilt = data.build(DataConfig())
    assert f"token cache {shard.parent}: train-00000.npy" in capsys.readouterr().err
    np.testing.assert_array_equal(np.asarray(rebuilt.train_tokens), np.asarray(builtin.train_tokens))
    np.testing.assert_array_equal(np.asarray(rebuilt.validation_tokens), np.asarray(builtin.validation_tokens))
    data.build(DataConfig())
    assert "token cache" not in capsys.readouterr().err  # the rebuilt cache passes its check


def test_fingerprint_tracks_text_tokenizer_and_split(tmp_path):
    config, _ = local_config(tmp_path, "jsonl")
    base = data.build(config)
    changed_text, _ = local_config(tmp_path / "other", "jsonl", docs=DOCS[:-1] + ["A different last document."])
    assert data.build(changed_text).fingerprint != base.fingerprint
    assert data.build(dataclasses.replace(config, validation_fraction=0.3)).fingerprint != base.fingerprint
    assert data.build(dataclasses.replace(config, seq_len=16)).fingerprint == base.fingerprint


# ---------------------------------------------------------------------------
# Local files and the hub path


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
def test_local_files_give_the_tokens_of_reading_the_file_directly(tmp_path, kind):
    config, path = local_config(tmp_path, kind)
    if kind == "txt":
        direct = [p for p in path.read_text(encoding="utf-8").split("\n\n") if p]
    elif kind == "jsonl":
        direct = [json.loads(line)["body"] for line in path.read_text(encoding="utf-8").splitlines()]
    else:
        direct = pq.read_table(path).column("body").to_pylist()
    assert corpus.load_documents(config) == direct
    pipeline = data.build(config)
    train, validation = corpus.split_documents(direct, config.validation_fraction)
    np.testing.assert_array_equal(pipeline.train_tokens, byte_stream(train, pipeline.eos_id))
    np.testing.assert_array_equal(pipeline.validation_tokens, byte_stream(validation, pipeline.eos_id))


def test_local_files_reject_unknown_suffix_and_missing_column(tmp_path):
    config, _ = local_config(tmp_path, "jsonl", text_field="missing")
    with pytest.raises(ValueError, match="text_field='missing'"):
        data.build(config)
    with pytest.raises(ValueError, match="suffixes"):
        data.build(DataConfig(source="local", paths=(str(tmp_path / "a.csv"),)))


HUB_SCRIPT = """
import datasets, json, sys
from scaling.config import DataConfig
from scaling.data import corpus, pipeline as data
assert datasets.config.HF_HUB_OFFLINE and datasets.config.HF_DATASETS_OFFLINE
config = DataConfig(source="hub", hub_name=sys.argv[1], hub_split=sys.argv[2], seq_len=8)
print(json.dumps({"documents": corpus.load_hub_documents(config), "stats": data.build(config).stats}))
"""


def test_hub_function_reads_a_hub_layout_folder_with_network_off(tmp_path):
    repo = tmp_path / "my-dataset"
    (repo / "data").mkdir(parents=True)
    splits = {"train": [f"train text {i} " * (1 + i % 3) for i in range(40)],
              "validation": [f"held-out text {i}" for i in range(10)]}
    for split, texts in splits.items():
        pq.write_table(pa.table({"text": texts, "id": list(range(len(texts)))}),
                       repo / "data" / f"{split}-00000-of-00001.parquet")
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
               "XDG_CACHE_HOME": str(tmp_path / "cache")}
    processes = [helpers.start([sys.executable, "-c", HUB_SCRIPT, repo, split], env=helpers.with_checkout(**offline))
                 for split in splits]
    for split, done in zip(splits, helpers.finish(processes, timeout=120)):
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["documents"] == splits[split]
        stats = result["stats"]
        assert stats["train_documents"] + stats["validation_documents"] == len(splits[split])
        assert stats["train_bytes"] + stats["validation_bytes"] == sum(len(t.encode()) for t in splits[split])


def test_max_documents_bounds_a_stream(tmp_path):
    config, _ = local_config(tmp_path, "parquet", max_documents=25)
    assert corpus.load_documents(config) == DOCS[:25]


# ---------------------------------------------------------------------------
# Tokenizers


@given(st.text(max_size=200))
@settings(max_examples=200, deadline=None)
def test_byte_tokenizer_round_trips_any_utf8(text):
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(text)
    assert len(ids) == len(text.encode("utf-8")) and (ids < 256).all()
    assert tokenizer.decode(ids) == text


@pytest.fixture(scope="module")
def small_bpe(tmp_path_factory):
    texts = [text for _, text in corpus.builtin_documents()]
    train, validation = corpus.split_documents(texts, 0.02)
    sample, total = [], 0
    for text in train:  # a few hundred KB keeps training under a second
        sample.append(text)
        total += len(text)
        if total > 300_000:
            break
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    return train_bpe(sample, 500, path), path, validation


def test_bpe_trained_on_builtin_corpus_round_trips_text(small_bpe):
    tokenizer, _, validation = small_bpe
    assert tokenizer.base_vocab_size == 500
    held_out = "\n\n".join(validation[:20])
    ids = tokenizer.encode(held_out)
    assert ids.max() < 500
    assert tokenizer.decode(ids) == held_out
    assert len(ids) < 0.6 * len(held_out.encode())  # it learned real subwords


@given(st.text(max_size=100))
@settings(max_examples=50, deadline=None)
def test_bpe_round_trips_arbitrary_text(small_bpe, text):
    tokenizer = small_bpe[0]
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_hf_tokenizer_from_a_local_path_drives_a_pipeline(small_bpe, tmp_path):
    tokenizer, path, _ = small_bpe
    loaded = load_hf(str(path.parent))  # a folder holding tokenizer.json
    assert loaded.identity == tokenizer.identity
    config, _ = local_config(tmp_path, "jsonl", tokenizer=f"hf:{path}")
    pipeline = data.build(config)
    assert pipeline.vocab_size == 504 and pipeline.eos_id == 501
    train, _ = corpus.split_documents(DOCS, config.validation_fraction)
    stream = np.asarray(pipeline.train_tokens)
    pieces = np.split(stream, np.flatnonzero(stream == pipeline.eos_id) + 1)[:-1]
    assert [tokenizer.decode(piece[:-1]) for piece in pieces] == train
    with pytest.raises(ValueError, match="does not exist"):
        load_hf(str(tmp_path / "nope.json"))


def test_bpe_option_trains_once_then_reuses_the_saved_file(tmp_path, own_cache_home):
    docs = [text for _, text in corpus.builtin_documents()[:150]]
    config, _ = local_config(tmp_path, "jsonl", docs=docs, tokenizer="bpe", bpe_vocab_size=400, seq_len=32)
    first = data.build(config)
    saved = list((own_cache_home / "tokenizers").glob("bpe-400-*.json"))
    assert len(saved) == 1 and first.vocab_size == 404
    assert data.build(config).fingerprint == first.fingerprint
    assert first.fingerprint != data.build(dataclasses.replace(config, tokenizer="byte")).fingerprint


# ---------------------------------------------------------------------------
# Packing, order, resume, multi-host


def test_packed_windows_are_shifted_slices_of_the_stream(builtin):
    batch = builtin.train_batch(seed=3, step=7, batch_size=8)
    T = builtin.seq_len
    assert batch["inputs"].shape == (8, T) and batch["inputs"].dtype == np.int32
    assert batch["weights"].dtype == np.float32 and batch["weights"].all() and batch["input_mask"].all()
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    offset, order = builtin.epoch_order(3, 0)
    for row in range(8):
        start = offset + order[7 * 8 + row] * T
        np.testing.assert_array_equal(batch["inputs"][row], builtin.train_tokens[start:start + T])
    assert (np.asarray(builtin.train_tokens) == builtin.eos_id).sum() == builtin.stats["train_documents"]


def test_one_epoch_visits_every_window_once_and_epochs_differ(tmp_path):
    config, _ = local_config(tmp_path, "parquet")
    pipeline = data.build(config)
    n, T = pipeline.train_windows, pipeline.seq_len
    epochs = [pipeline.train_batch(seed=1, step=e, batch_size=n)["inputs"] for e in range(2)]
    for epoch, inputs in enumerate(epochs):
        offset, _ = pipeline.epoch_order(1, epoch)
        grid = np.stack([pipeline.train_tokens[offset + w * T: offset + (w + 1) * T] for w in range(n)])
        assert sorted(map(bytes, inputs.astype(np.int32))) == sorted(map(bytes, grid.astype(np.int32)))
    assert not np.array_equal(epochs[0], epochs[1])


@pytest.mark.parametrize("source", ["builtin", "local", "parity", "lookback"])
def test_restart_at_step_k_gives_the_uninterrupted_batches(builtin, tmp_path, source):
    if source == "builtin":
        config = builtin.config
    elif source == "local":  # tiny corpus: steps 5..15 cross several epoch boundaries
        config, _ = local_config(tmp_path, "txt", seq_len=128)
        assert data.build(config).train_windows < 8 * 4
    else:
        config = DataConfig(source=source, seq_len=40)
    k, batch_size = 5, 8
    uninterrupted = data.build(config).train_iterator(seed=11, start_step=0, batch_size=batch_size)
    before = [next(uninterrupted) for _ in range(k + 11)]
    uninterrupted.close()
    restarted = data.build(config).train_iterator(seed=11, start_step=k, batch_size=batch_size, prefetch=3)
    after = [next(restarted) for _ in range(11)]
    restarted.close()
    for (step_a, batch_a), (step_b, batch_b) in zip(before[k:], after):
        assert step_a == step_b
        for key in batch_a:
            np.testing.assert_array_equal(batch_a[key], batch_b[key])
    assert not np.array_equal(before[k][1]["inputs"], before[k + 1][1]["inputs"])
    other_seed = data.build(config).train_batch(seed=12, step=k, batch_size=batch_size)
    assert not np.array_equal(other_seed["inputs"], after[0][1]["inputs"])


def test_prefetch_thread_stops_when_the_iterator_is_closed(builtin):
    iterator = builtin.train_iterator(seed=0, start_step=0, batch_size=4, prefetch=2)
    next(iterator)
    iterator.close()
    deadline = time.time() + 5
    while any(t.name == "data-prefetch" for t in threading.enumerate()) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "data-prefetch" for t in threading.enumerate())


@pytest.mark.parametrize("source", ["builtin", "parity", "first", "lookback"])
@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_process_slices_concatenate_to_the_global_batch(builtin, source, process_count):
    pipeline = builtin if source == "builtin" else data.build(DataConfig(source=source, seq_len=40))
    whole = pipeline.train_batch(seed=5, step=9, batch_size=8)
    slices = [pipeline.train_batch(5, 9, 8, process_index=p, process_count=process_count)
              for p in range(process_count)]
    whole_validation = pipeline.validation_batches(8, 2)
    validation_slices = [pipeline.validation_batches(8, 2, p, process_count) for p in range(process_count)]
    for key in whole:
        assert all(s[key].shape[0] == 8 // process_count for s in slices)
        np.testing.assert_array_equal(np.concatenate([s[key] for s in slices]), whole[key])
        for b in range(2):
            np.testing.assert_array_equal(np.concatenate([v[b][key] for v in validation_slices]),
                                          whole_validation[b][key])


def test_batch_size_must_divide_among_processes(builtin):
    with pytest.raises(ValueError, match="batch_size=6"):
        builtin.train_batch(0, 0, 6, process_index=0, process_count=4)
    with pytest.raises(ValueError, match="batch_size=6"):
        builtin.train_iterator(0, 0, 6, process_count=4)


def test_validation_set_is_fixed_and_comes_from_validation_text(builtin, tmp_path):
    first = builtin.validation_batches(batch_size=4, num_batches=3)
    second = data.build(builtin.config).validation_batches(batch_size=6, num_batches=2)
    np.testing.assert_array_equal(np.concatenate([b["inputs"] for b in first]),
                                  np.concatenate([b["inputs"] for b in second]))
    T = builtin.seq_len
    np.testing.assert_array_equal(first[0]["inputs"][1], builtin.validation_tokens[T:2 * T])
    small, _ = local_config(tmp_path, "jsonl")  # asks for more windows than exist: cycles
    pipeline = data.build(small)
    rows = pipeline.validation_batches(pipeline.validation_windows + 1, 1)[0]["inputs"]
    np.testing.assert_array_equal(rows[pipeline.validation_windows], rows[0])


# ---------------------------------------------------------------------------
# Synthetic tasks


@pytest.mark.parametrize("source", ["parity", "first"])
def test_parity_and_first_put_cls_first_and_the_label_at_cls(source):
    config = DataConfig(source=source, seq_len=24, synthetic_min_length=3, synthetic_max_length=9,
                        synthetic_eval_min_length=12, synthetic_eval_max_length=20)
    pipeline = data.build(config)
    assert pipeline.kind == "classification" and pipeline.vocab_size == 260
    for batch, (low, high) in ((pipeline.train_batch(seed=2, step=0, batch_size=1000), (3, 9)),
                               (pipeline.validation_batches(1000, 1)[0], (12, 20))):
        # Each split is padded to its own longest string plus CLS, not to seq_len.
        assert batch["inputs"].shape == (1000, high + 1)
        # CLS is the first token of every example, and appears nowhere else.
        assert (batch["inputs"][:, 0] == pipeline.cls_id).all()
        assert ((batch["inputs"] == pipeline.cls_id).sum(axis=1) == 1).all()
        lengths = batch["input_mask"].sum(axis=1).astype(int) - 1
        for row, n in enumerate(lengths):
            bits = batch["inputs"][row, 1:n + 1] - ord("0")
            assert set(bits.tolist()) <= {0, 1}
            expected = bits.sum() % 2 if source == "parity" else bits[0]
            assert batch["targets"][row, 0] == pipeline.LABEL_TOKENS[expected]
            assert batch["weights"][row].sum() == 1.0 and batch["weights"][row, 0] == 1.0
            assert (batch["input_mask"][row] == (np.arange(high + 1) <= n)).all()
            assert (batch["inputs"][row, n + 1:] == pipeline.pad_id).all()
        assert lengths.min() == low and lengths.max() == high
        assert 400 < (batch["targets"][:, 0] == ord("1")).sum() < 600


def test_fixed_training_set_repeats_its_strings_each_epoch_in_a_new_order():
    config = DataConfig(source="first", seq_len=11, synthetic_min_length=10, synthetic_max_length=10,
                        synthetic_eval_min_length=10, synthetic_eval_max_length=10, synthetic_train_size=20)
    pipeline = data.build(config)
    epochs = [pipeline.train_batch(seed=1, step=epoch, batch_size=20)["inputs"] for epoch in range(3)]
    as_sets = [sorted(map(tuple, rows.tolist())) for rows in epochs]
    assert as_sets[0] == as_sets[1] == as_sets[2]  # the same 20 strings every epoch
    assert len(set(as_sets[0])) > 15  # (2**10 strings: a few repeats by chance at most)
    assert not (epochs[0] == epochs[1]).all()  # visited in another order
    other_seed = pipeline.train_batch(seed=2, step=0, batch_size=20)["inputs"]
    assert sorted(map(tuple, other_seed.tolist())) != as_sets[0]
    fresh = data.build(dataclasses.replace(config, synthetic_train_size=0))
    assert sorted(map(tuple, fresh.train_batch(seed=1, step=1, batch_size=20)["inputs"].tolist())) != as_sets[0]


def test_fresh_strings_draw_a_new_string_for_every_step_and_example():
    """``synthetic_train_size=0``: every example of every step is its own draw from the seeded stream
    (the FIRST authors' training: a new random string at every step), independent of batch size."""
    config = DataConfig(source="first", seq_len=31, synthetic_min_length=30, synthetic_max_length=30,
                        synthetic_eval_min_length=30, synthetic_eval_max_length=30, synthetic_train_size=0)
    pipeline = data.build(config)
    rows = [tuple(pipeline.train_batch(seed=3, step=step, batch_size=1)["inputs"][0]) for step in range(200)]
    assert len(set(rows)) == 200  # 2**30 strings: a repeat among 200 would be a bug, not chance
    ten = pipeline.train_batch(seed=3, step=0, batch_size=10)["inputs"]
    assert [tuple(r) for r in ten] == rows[:10]  # example i is string i whatever the batch size
    assert tuple(pipeline.train_batch(seed=4, step=0, batch_size=1)["inputs"][0]) != rows[0]


def test_classification_needs_room_for_the_longest_string():
    with pytest.raises(ValueError, match="seq_len=32"):
        data.build(DataConfig(source="parity", seq_len=32, synthetic_eval_max_length=32))


@pytest.mark.parametrize("distance", [1, 7, 30])
def test_lookback_targets_copy_exactly_distance_back(distance):
    pipeline = data.build(DataConfig(source="lookback", seq_len=64, lookback_distance=distance))
    batch = pipeline.train_batch(seed=0, step=3, batch_size=32)
    window = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
    t = np.arange(64)
    weighted = batch["weights"] == 1.0
    assert not weighted[:, t + 1 < distance].any()
    rows, cols = np.nonzero(weighted)
    np.testing.assert_array_equal(batch["targets"][rows, cols], window[rows, cols + 1 - distance])
    eligible = (t + 1 >= distance).sum() * 32
    assert 0.4 < weighted.sum() / eligible < 0.6
    # Unweighted positions are fresh letters: they differ from distance-back about 25/26 of the time.
    fresh_rows, fresh_cols = np.nonzero(~weighted & (t + 1 >= distance))
    same = batch["targets"][fresh_rows, fresh_cols] == window[fresh_rows, fresh_cols + 1 - distance]
    assert same.mean() < 0.15
    with pytest.raises(ValueError, match="lookback_distance=64"):
        data.build(DataConfig(source="lookback", seq_len=64, lookback_distance=64))


# ---------------------------------------------------------------------------
# Command line


def test_cli_batch_hash_matches_the_in_process_batch(builtin, cache_dir):
    args = ["--seed", "4", "--step", "12", "--batch-size", "8", "--seq-len", "64", "--cache-dir", str(cache_dir)]
    processes = [helpers.start(helpers.module_command("scaling.data", "batch-hash", "--source", "builtin", *args)),
                 helpers.start(helpers.module_command("scaling.data", "batch-hash", "--source", "builtin",
                                                      *[a if a != "12" else "13" for a in args]))]
    (code, out, err), (code2, out2, _) = [(done.returncode, done.stdout, done.stderr)
                                          for done in helpers.finish(processes, timeout=120)]
    assert code == 0 and code2 == 0, err
    lines = out.splitlines()
    assert len(lines) == 1 and len(lines[0]) == 64
    pipeline = data.build(DataConfig(seq_len=64, cache_dir=str(cache_dir)))
    assert lines[0] == data.batch_digest(pipeline.train_batch(4, 12, 8))
    assert out2.strip() != lines[0]


def test_cli_bad_input_prints_one_error_line():
    done = helpers.run_module("scaling.data", "batch-hash", "--source", "parity", "--seed", "0", "--step", "0",
                              "--batch-size", "4", "--seq-len", "8", timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "seq_len=8" in done.stderr
