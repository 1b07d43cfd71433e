"""Tokenizers: bytes (default), a BPE trained on the corpus, or any Hugging Face one.

Every tokenizer maps text to ids in ``[0, base_vocab_size)``. The data
pipeline appends its four special tokens (pad, eos, mask, cls) right after
that range, so a model's vocabulary is ``base_vocab_size + 4``.

- ``byte``: the UTF-8 bytes of the text, ids 0..255. Needs no files.
- ``bpe``: a byte-level BPE trained with the ``tokenizers`` library on the
  training split of the corpus and saved as a ``tokenizer.json`` in the data
  cache, so offline users still get a real subword vocabulary. Byte-level
  pre-tokenization means any UTF-8 text round-trips exactly.
- ``hf:NAME_OR_PATH``: a Hugging Face tokenizer, from a local
  ``tokenizer.json`` (or a folder holding one) or downloaded by hub name.
  Its own special tokens are not added: documents are separated by our EOS.
"""

from __future__ import annotations

import hashlib
import pathlib
from typing import Iterable

import numpy as np
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from scaling.store.storage import write_atomic


class ByteTokenizer:
    """UTF-8 bytes as token ids (256 ids)."""

    base_vocab_size = 256
    identity = "byte-utf8"

    def encode(self, text: str) -> np.ndarray:
        """Token ids (uint8 values as int32) of ``text``: one per UTF-8 byte."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """``encode`` for many documents."""
        return [self.encode(text) for text in texts]

    def decode(self, ids) -> str:
        """Text of byte ids; invalid UTF-8 (e.g. a cut multi-byte char) becomes U+FFFD."""
        return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers.Tokenizer``, used without its own special tokens."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, name: str):
        self.tokenizer = tokenizer
        self.name = name
        self.base_vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        # The serialized tokenizer pins vocabulary, merges and normalization.
        self.identity = "hf-" + hashlib.sha256(tokenizer.to_str().encode()).hexdigest()

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int32) of ``text``."""
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of many documents, encoded in parallel by the Rust library."""
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

    def decode(self, ids) -> str:
        """Text of token ids."""
        return self.tokenizer.decode(np.asarray(ids).tolist(), skip_special_tokens=False)


def train_bpe(texts: Iterable[str], vocab_size: int, path: pathlib.Path | None = None) -> HFTokenizer:
    """Train a byte-level BPE with ``vocab_size`` tokens (including the 256
    byte symbols) on ``texts``; save it as ``path`` (tokenizer.json) if given."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, tokenizer.to_str(pretty=True))  # hosts sharing a cache never read half a file
    return HFTokenizer(tokenizer, f"bpe-{vocab_size}")


def load_hf(name_or_path: str) -> HFTokenizer:
    """A Hugging Face tokenizer from a tokenizer.json file, a folder holding
    one, or (needing network) a hub model name."""
    path = pathlib.Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if path.is_file():
        return HFTokenizer(tokenizers.Tokenizer.from_file(str(path)), name_or_path)
    if path.suffix == ".json" or name_or_path.startswith((".", "/", "~")):
        raise ValueError(f"tokenizer file {name_or_path!r} does not exist")
    try:
        return HFTokenizer(tokenizers.Tokenizer.from_pretrained(name_or_path), name_or_path)
    except Exception as error:  # the library raises bare Exceptions for hub failures
        raise ValueError(f"could not load Hugging Face tokenizer {name_or_path!r}: {error}") from error


def build_tokenizer(spec: str, train_texts: list[str], corpus_hash: str, vocab_size: int,
                    cache_dir: pathlib.Path):
    """The tokenizer named by ``DataConfig.tokenizer``. A ``bpe`` tokenizer is
    trained on ``train_texts`` once and reused from ``cache_dir`` afterwards
    (keyed by the corpus hash and ``vocab_size``)."""
    if spec == "byte":
        return ByteTokenizer()
    if spec == "bpe":
        path = cache_dir / "tokenizers" / f"bpe-{vocab_size}-{corpus_hash[:16]}.json"
        if path.exists():
            return HFTokenizer(tokenizers.Tokenizer.from_file(str(path)), f"bpe-{vocab_size}")
        return train_bpe(train_texts, vocab_size, path)
    if spec.startswith("hf:"):
        return load_hf(spec[3:])
    raise ValueError(f"tokenizer={spec!r} is invalid: allowed 'byte', 'bpe' or 'hf:NAME_OR_PATH'")
