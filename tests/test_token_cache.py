"""Tests of the pre-tokenised token cache: building (resumable, dtype), reading
only the cache (no source, no hub, only a process's own rows), refusing a
missing, incomplete, damaged or mismatched cache.

Training from a cache on gs:// is in test_storage.py (one training run
serves both)."""

import dataclasses
import json
import pathlib
import re
import shlex
from urllib.parse import unquote

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

import helpers
from gcs_emulator import FaultProxy
from helpers import REPO
from scaling.config import DataConfig
from scaling.data import corpus, pipeline as data, __main__ as data_cli, token_cache

DOCS = [f"Document {i}: caf\u00e9 \u2014 {'word ' * (i % 7)}\u00fcber {i * i} \U0001f600 end." for i in range(60)]

# Token caches built on first use go under each test's directory (conftest.py).
pytestmark = pytest.mark.usefixtures("own_cache_home")


def jsonl_config(tmp_path, docs=DOCS, **overrides) -> tuple[DataConfig, pathlib.Path]:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs), encoding="utf-8")
    options = dict(source="local", paths=(str(path),), text_field="body", seq_len=16, validation_fraction=0.2)
    return DataConfig(**{**options, **overrides}), path


def cli_cache(config: DataConfig, directory, *extra) -> None:
    """``python -m scaling.data cache`` for ``config``, in this process."""
    words = token_cache.cache_command(config, directory).split()[3:]  # drop "python -m scaling.data"
    data_cli.main([*words, "--quiet", *extra])


def forbid_reading_the_source(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the corpus source was read")

    monkeypatch.setattr(corpus, "load_documents", refuse)
    monkeypatch.setattr(token_cache.corpus, "load_documents", refuse)
    monkeypatch.setattr(tokenizers.Tokenizer, "from_pretrained", refuse)


def test_a_cache_serves_the_same_batches_after_the_source_is_gone(tmp_path, monkeypatch, capsys):
    config, path = jsonl_config(tmp_path)
    before = data.build(config)  # read from the file (through a first-use cache)
    digests = [data.batch_digest(before.train_batch(7, step, 4)) for step in range(6)]
    validation = [data.batch_digest(b) for b in before.validation_batches(4, 2)]
    directory = tmp_path / "shared-cache"
    cli_cache(config, directory, "--shard-documents", "7")  # several shards: windows cross their boundaries
    assert "train with --set data.cache_dir=" in capsys.readouterr().out
    path.unlink()

    offline = helpers.with_checkout(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", XDG_CACHE_HOME=str(tmp_path / "empty"))
    words = token_cache.cache_command(config, directory).split()[4:]
    fresh = helpers.run_module("scaling.data", "batch-hash", *words, "--seq-len", "16", "--seed", "7", "--step", "5",
                               "--batch-size", "4", env=offline, timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.strip() == digests[5]

    forbid_reading_the_source(monkeypatch)
    cached = data.build(dataclasses.replace(config, cache_dir=str(directory)))
    assert [data.batch_digest(cached.train_batch(7, step, 4)) for step in range(6)] == digests
    assert [data.batch_digest(b) for b in cached.validation_batches(4, 2)] == validation
    assert cached.fingerprint == before.fingerprint and cached.stats == before.stats
    assert len(json.loads((directory / "metadata.json").read_text())["shards"]["train"]) > 1


def test_each_process_reads_only_its_own_rows(tmp_path):
    config, _ = jsonl_config(tmp_path)
    directory = token_cache.build_cache(config, tmp_path / "cache", documents_per_shard=7)
    config = dataclasses.replace(config, cache_dir=str(directory))
    whole = data.build(config).train_batch(3, 5, 8)
    processes = [data.build(config) for _ in range(2)]  # each its own reader, as on two hosts
    assert all(p.train_tokens.bytes_read == 0 for p in processes)  # opening reads no tokens
    rows = [p.train_batch(3, 5, 8, process_index=i, process_count=2) for i, p in enumerate(processes)]
    window_bytes = 4 * (config.seq_len + 1) * 2  # 4 rows of seq_len + 1 uint16 tokens
    cache_bytes = 2 * (len(processes[0].train_tokens) + len(processes[0].validation_tokens))
    for pipeline in processes:
        assert pipeline.train_tokens.bytes_read == window_bytes < cache_bytes / 10
        assert pipeline.validation_tokens.bytes_read == 0
    for key in whole:
        np.testing.assert_array_equal(np.concatenate([r[key] for r in rows]), whole[key])
    assert not np.array_equal(rows[0]["inputs"], rows[1]["inputs"])


def test_an_interrupted_build_resumes_where_it_stopped(tmp_path, monkeypatch):
    config, _ = jsonl_config(tmp_path)
    real_write = token_cache._write_shard
    written = []

    def write_then_stop(directory, name, *args):
        if len(written) == 3:
            raise KeyboardInterrupt  # the machine goes away mid-build
        written.append(name)
        return real_write(directory, name, *args)

    directory = tmp_path / "cache"
    monkeypatch.setattr(token_cache, "_write_shard", write_then_stop)
    with pytest.raises(KeyboardInterrupt):
        token_cache.build_cache(config, directory, documents_per_shard=7)
    assert not (directory / "metadata.json").exists()
    with pytest.raises(token_cache.CacheError, match="is incomplete"):
        data.build(dataclasses.replace(config, cache_dir=str(directory)))
    with pytest.raises(token_cache.CacheError, match=r"documents_per_shard 7 \(now 9\)"):
        token_cache.build_cache(config, directory, documents_per_shard=9)
    finished = {name: (directory / f"{name}.npy").stat().st_mtime_ns for name in written}

    resumed = []
    monkeypatch.setattr(token_cache, "_write_shard",
                        lambda directory, name, *args: resumed.append(name) or real_write(directory, name, *args))
    token_cache.build_cache(config, directory, documents_per_shard=7)
    assert not set(resumed) & set(written) and resumed  # finished shards were skipped, the rest written
    assert {name: (directory / f"{name}.npy").stat().st_mtime_ns for name in written} == finished
    metadata = json.loads((directory / "metadata.json").read_text())
    assert len(written) + len(resumed) == sum(len(shards) for shards in metadata["shards"].values())
    uninterrupted = token_cache.build_cache(config, tmp_path / "other", documents_per_shard=7)
    assert metadata == json.loads((uninterrupted / "metadata.json").read_text())


def word_tokenizer(tmp_path, size: int) -> pathlib.Path:
    """A word-level Hugging Face tokenizer of ``size`` ids (w1 .. w{size-1}), saved as a file."""
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, size)}}
    tokenizer = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / f"words-{size}.json"
    tokenizer.save(str(path))
    return path


def test_token_dtype_is_uint16_while_the_vocabulary_fits():
    assert token_cache.token_dtype(260) == np.uint16
    assert token_cache.token_dtype(2**16) == np.uint16  # ids 0 .. 65535
    assert token_cache.token_dtype(2**16 + 1) == np.uint32


@pytest.mark.parametrize("size", [1000, 70_000])
def test_shards_hold_uint32_only_for_large_vocabularies(tmp_path, monkeypatch, size):
    rng = np.random.default_rng(0)
    docs = [" ".join(f"w{i}" for i in rng.integers(1, size, 30)) for _ in range(40)]
    tokenizer_file = word_tokenizer(tmp_path, size)
    config, _ = jsonl_config(tmp_path, docs=docs, tokenizer=f"hf:{tokenizer_file}")
    directory = token_cache.build_cache(config, tmp_path / "cache")
    tokenizer_file.unlink()  # readers use the cache's own copy of the tokenizer
    forbid_reading_the_source(monkeypatch)
    pipeline = data.build(dataclasses.replace(config, cache_dir=str(directory)))
    expected = np.uint16 if size + 4 <= 2**16 else np.uint32
    assert np.load(directory / "train-00000.npy").dtype == expected
    assert pipeline.vocab_size == size + 4 and pipeline.eos_id == size + 1
    train, _ = corpus.split_documents(docs, 0.2)
    direct = [int(word[1:]) for doc in train for word in [*doc.split(), f"w{size + 1}"]]
    np.testing.assert_array_equal(np.asarray(pipeline.train_tokens), direct)
    assert pipeline.train_batch(0, 0, 4)["inputs"].max() < pipeline.vocab_size


def test_missing_incomplete_mismatched_or_damaged_caches_are_refused_in_one_line(tmp_path):
    with pytest.raises(token_cache.CacheError) as missing:
        data.build(DataConfig(cache_dir=str(tmp_path / "nowhere")))
    message = str(missing.value)
    assert "no token cache at" in message and "\n" not in message
    assert "python -m scaling.data cache --source builtin" in message

    config, _ = jsonl_config(tmp_path)
    directory = token_cache.build_cache(config, tmp_path / "cache", documents_per_shard=20)
    for field, value in [("validation_fraction", 0.3), ("tokenizer", "bpe"), ("text_field", "text"),
                         ("paths", (str(tmp_path / "elsewhere.jsonl"),)), ("source", "builtin")]:
        other = dataclasses.replace(config, cache_dir=str(directory), **{field: value})
        with pytest.raises(token_cache.CacheError, match=f"built with {field}=.* but the config has data.{field}="):
            data.build(other)
    with pytest.raises(token_cache.CacheError, match="already holds a token cache of other data"):
        token_cache.build_cache(dataclasses.replace(config, validation_fraction=0.3), directory)

    shard = directory / "train-00001.npy"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(token_cache.CacheError, match="is damaged: train-00001.npy has"):
        data.build(dataclasses.replace(config, cache_dir=str(directory)))


def test_cli_reports_a_missing_cache_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        data_cli.main(["batch-hash", "--cache-dir", str(tmp_path / "none"), "--seed", "0", "--step", "0",
                   "--batch-size", "4"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no token cache at") and "\n" not in err
    with pytest.raises(SystemExit):
        data_cli.main(["cache", "--source", "builtin"])
    assert "cache needs --cache-dir" in capsys.readouterr().err


def documented_cache_commands(text: str) -> list[list[str]]:
    """The ``python -m scaling.data cache`` commands in ``text`` (backslash continuations joined), as words."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [shlex.split(line.strip())[3:] for line in joined.splitlines()
            if line.strip().startswith("python -m scaling.data cache ")]


def test_the_paper_sweep_and_the_pods_page_cache_the_corpus_the_sweep_trains_on():
    from sweeps.configs import paper

    commands = documented_cache_commands(paper.__doc__) + documented_cache_commands(
        (REPO / "docs" / "pods.md").read_text())
    assert len(commands) == 2
    for words in commands:
        args = data_cli._parser().parse_args([word.replace("$BUCKET", "gs://b") for word in words])
        built_for = data_cli._config_from_args(args)
        assert token_cache.describe_source(built_for) == token_cache.describe_source(paper.sweep().base.data)


def test_the_token_cache_fetches_a_steps_rows_in_a_few_requests(gcs, gcs_emulator, tmp_path, monkeypatch):
    from scaling.data import pipeline as data
    from scaling.store import storage

    proxy = FaultProxy(gcs_emulator.url)  # counts the requests that reach the storage
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        storage.use_emulator()
        local = DataConfig(source="builtin", seq_len=64)
        token_cache.build_cache(local, f"{gcs}/tokens", documents_per_shard=1500)
        config = DataConfig(source="builtin", seq_len=64, cache_dir=f"{gcs}/tokens")
        pipeline, reference = data.build(config), data.build(local)
        shards = len(pipeline.train_tokens.paths)
        assert shards >= 2

        def token_gets() -> int:
            return sum(1 for method, path in proxy.requests if method == "GET" and "alt=media" in path
                       and "tokens/train-" in unquote(path))

        per_step = []
        for step in range(20):
            before = token_gets()
            rows = pipeline.train_batch(0, step, 16, process_index=1, process_count=2)
            per_step.append(token_gets() - before)
            expected = reference.train_batch(0, step, 16, process_index=1, process_count=2)
            for key in expected:
                np.testing.assert_array_equal(rows[key], expected[key])
        # 8 windows a step, spread over the split (one range request each before): now each shard is
        # fetched whole once, then read locally, so 20 steps cost at most one request per shard.
        assert 1 <= sum(per_step) <= shards and sum(per_step) / len(per_step) <= 0.25, per_step
        assert sorted(p.name for p in (tmp_path / "xdg" / "scaling-data" / "copies").rglob("train-*.npy"))
    finally:
        proxy.close()
