"""The trainer and the TPU preflight build one program, and a run's record counts its real model.

Both take ``scaling.model.program.build``'s data arguments from ``scaling.data.pipeline.program_arguments``:
a PARITY run trains with its two-logit loss, and the preflight must price that program, not the
full-vocabulary one.
"""

import dataclasses

import pytest

import tiny
from scaling.config import DataConfig, ModelConfig, TrainConfig
from scaling.data import pipeline as data
from scaling.data.corpus import builtin_documents
from scaling.data.tokenizer import train_bpe
from scaling.model import budget, program as program_lib, run_program
from scaling.run import train
from scaling.store import records
from sweeps import preflight

CAUSAL = tiny.config()
PARITY = TrainConfig(model=ModelConfig(depth=1, width=16, head_dim=16, max_seq_len=40, objective="masked"),
                     data=DataConfig(source="parity", seq_len=40), steps=2, batch_size=8, wandb_mode="disabled")
MASKED = dataclasses.replace(CAUSAL, model=dataclasses.replace(CAUSAL.model, objective="masked"))


@pytest.mark.parametrize("config", [CAUSAL, PARITY, MASKED], ids=["causal", "parity", "masked"])
def test_trainer_and_preflight_build_the_same_program(config):
    pipeline = data.build(config.data)
    resolved = train.resolve_config(config, pipeline)
    trained = run_program.build([resolved], tiny.one_device()).solo
    priced_shape, _ = preflight.program_key(resolved)
    assert trained.shape == priced_shape
    if config is PARITY:
        assert priced_shape.label_ids == tuple(pipeline.LABEL_TOKENS)  # the two-logit loss
    if config is MASKED:
        assert priced_shape.mask_id == pipeline.mask_id


def test_record_counts_follow_the_tokenizers_vocabulary(tmp_path):
    text = "".join(body for _, body in builtin_documents()[:200])
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text(text)
    tokenizer_file = tmp_path / "tokenizer.json"
    train_bpe([text[:200_000]], 400, tokenizer_file)
    config = tiny.config(data=DataConfig(source="local", paths=(str(corpus_file),), tokenizer=f"hf:{tokenizer_file}",
                                         seq_len=32),
                         steps=2, checkpoint_every=2)
    assert config.model.vocab_size == 260  # the default the user's config keeps
    record = tiny.run(config, tmp_path / "run")
    resolved_vocab = data.build(config.data).vocab_size
    assert resolved_vocab != 260
    resolved = dataclasses.replace(config.model, vocab_size=resolved_vocab)
    counts = budget.count_params(resolved)
    assert (record.params_total, record.params_embedding) == (counts["total"], counts["embedding"])
    on_disk = records.read_record(tmp_path / "run")
    assert on_disk.params_total == counts["total"]
