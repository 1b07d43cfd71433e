"""Data pipeline: text sources and synthetic tasks, cut into seeded, resumable,
per-host batches.

Sources (``DataConfig.source``)
    ``builtin``   the Python 3.11 documentation prose shipped with the package
                  (about 7.4 MB, 4,200 documents; see ``scaling.data.corpus``).
    ``hub``       a Hugging Face dataset, streamed:
                  ``datasets.load_dataset(hub_name, hub_config, split=hub_split, streaming=True)``.
    ``local``     text / jsonl / parquet files through ``datasets``. A text
                  file's documents are its blank-line-separated paragraphs.
    For ``hub`` and ``local`` the first ``max_documents`` documents of the
    stream are used, from ``text_field``; empty ones are skipped.
    ``parity``, ``first``   classification tasks of "Overcoming a Theoretical
                  Limitation of Self-Attention", see ``ClassificationTask``.
    ``lookback``  an LM task with a controllable dependency distance, see ``LookbackTask``.

Split (``scaling.data.corpus.split_documents``)
    A text document goes to validation when the first 8 bytes of the SHA-256
    of its text, read as a fraction of 2**64, fall below
    ``validation_fraction``. The split depends only on the text, so it is the
    same on every machine, and duplicated documents never straddle it.

Tokens and packing
    Token ids come from ``scaling.data.tokenizer``; four special ids follow the
    tokenizer's range: pad, eos, mask, cls (byte tokenizer: 256..259, so the
    vocabulary is 260). Each split is one stream: every document followed by
    eos. A training example is a window of ``seq_len + 1`` tokens:
    ``inputs = window[:-1]``, ``targets = window[1:]``, all weights 1. The
    masked objective uses the same ``inputs``; the trainer masks them itself.

Token cache (``scaling.data.token_cache``)
    Every text source is read through a token cache, one code path. With
    ``cache_dir`` set, the pipeline reads only that pre-built cache (local or
    ``gs://``; build it once with ``python -m scaling.data cache``): the
    fingerprint comes from its metadata, no source or hub is touched, and each
    process fetches only the windows of its own rows. Unset, the source is read,
    tokenised into ``~/.cache/scaling-data/tokens-<fingerprint>`` on first use,
    and read from there.

Order and resume
    Epoch ``e`` of seed ``s`` shifts the window grid by a random offset in
    ``[0, seq_len)`` and visits the windows in a random permutation, both drawn
    from ``numpy.random.default_rng([s, e])``. Example ``i`` of the run is
    position ``i mod n`` of epoch ``i div n`` (``n`` windows per epoch), and
    step ``k`` holds examples ``k*B .. k*B + B - 1``. So any step's batch is a
    pure function of (data config, seed, step, batch size): a restart at step
    ``k`` needs no replay and no saved iterator state.

Multi-host
    Process ``p`` of ``P`` gets rows ``p*B/P .. (p+1)*B/P - 1`` of the global
    batch and computes (for text: reads from the token cache) only those.
    Concatenating all processes' rows gives the single-process batch.

Validation
    Fixed: consecutive non-overlapping windows of the validation stream from
    its start (cycling if more are asked for than exist), or examples of the
    synthetic tasks drawn from a constant seed. It never depends on the run's
    seed, so every run sharing a data config sees the same validation set.

Fingerprint
    SHA-256 of the corpus text (train and validation documents in order),
    the tokenizer (its full serialization), the split fraction and a format
    version; for synthetic tasks, of the task's settings. Runs with different
    fingerprints were trained on different data. A token cache stores the
    fingerprint computed when it was built, so reading it needs no text.

Command line: ``python -m scaling.data --help`` (``scaling.data.__main__``).
"""

from __future__ import annotations

import hashlib
import itertools
import queue
import threading

import numpy as np

from scaling.config import CLASSIFICATION_SOURCES, SYNTHETIC_SOURCES, DataConfig
from scaling.data import token_cache
from scaling.data.token_cache import SPECIAL_TOKENS
from scaling.data.tokenizer import ByteTokenizer

VALIDATION_SEED = 20200  # synthetic validation examples use this seed, never the run's


# ---------------------------------------------------------------------------
# Pipelines


class Pipeline:
    """Batches of one data config. Subclasses define ``examples``; every
    batch is a dict of ``inputs``/``targets`` (int32 [B, T]) and
    ``weights``/``input_mask`` (float32 [B, T]) for this process's B rows."""

    kind = "lm"

    def __init__(self, config: DataConfig, tokenizer, fingerprint: str):
        self.config = config
        self.tokenizer = tokenizer
        self.seq_len = config.seq_len
        base = tokenizer.base_vocab_size
        self.pad_id, self.eos_id, self.mask_id, self.cls_id = range(base, base + len(SPECIAL_TOKENS))
        self.vocab_size = base + len(SPECIAL_TOKENS)
        self.fingerprint = fingerprint
        # For run records; text sources add corpus sizes.
        self.stats = {"source": config.source, "tokenizer": config.tokenizer, "fingerprint": fingerprint,
                      "vocab_size": self.vocab_size}

    def examples(self, split: str, seed: int, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Examples number ``indices`` of ``split`` ("train" or "validation")."""
        raise NotImplementedError

    @staticmethod
    def _rows(batch_size: int, process_index: int, process_count: int) -> np.ndarray:
        if process_count < 1 or not 0 <= process_index < process_count:
            raise ValueError(f"process_index={process_index} must be in [0, process_count={process_count})")
        if batch_size < 1 or batch_size % process_count:
            raise ValueError(f"batch_size={batch_size} must be a positive multiple of "
                             f"process_count={process_count}")
        per_process = batch_size // process_count
        return np.arange(process_index * per_process, (process_index + 1) * per_process, dtype=np.int64)

    def train_batch(self, seed: int, step: int, batch_size: int, process_index: int = 0,
                    process_count: int = 1) -> dict[str, np.ndarray]:
        """This process's rows of the global training batch of ``batch_size``
        sequences at optimizer step ``step``; computed directly from
        (seed, step), without replaying earlier steps."""
        if seed < 0 or step < 0:
            raise ValueError(f"seed={seed} and step={step} must be >= 0")
        rows = self._rows(batch_size, process_index, process_count)
        return self.examples("train", seed, step * batch_size + rows)

    def train_iterator(self, seed: int, start_step: int, batch_size: int, process_index: int = 0,
                       process_count: int = 1, prefetch: int = 2):
        """Yield (step, batch) for step = start_step, start_step + 1, ...,
        assembling up to ``prefetch`` batches ahead in a background thread.
        The batches equal ``train_batch`` for the same arguments."""
        self._rows(batch_size, process_index, process_count)  # fail now, not in the thread
        if seed < 0 or start_step < 0:
            raise ValueError(f"seed={seed} and start_step={start_step} must be >= 0")
        return self._prefetched(seed, start_step, batch_size, process_index, process_count, max(1, prefetch))

    def _prefetched(self, seed, start_step, batch_size, process_index, process_count, prefetch):
        ready: queue.Queue = queue.Queue(maxsize=prefetch)
        stop = threading.Event()

        def produce():
            for step in itertools.count(start_step):
                try:
                    item = (step, self.train_batch(seed, step, batch_size, process_index, process_count))
                except Exception as error:  # handed to the consumer, which re-raises it
                    item = error
                while not stop.is_set():
                    try:
                        ready.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if stop.is_set() or isinstance(item, Exception):
                    return

        thread = threading.Thread(target=produce, name="data-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = ready.get()
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            stop.set()

    def validation_batches(self, batch_size: int, num_batches: int, process_index: int = 0,
                           process_count: int = 1) -> list[dict[str, np.ndarray]]:
        """The fixed validation set: ``num_batches`` global batches of
        ``batch_size`` sequences (this process's rows of each)."""
        rows = self._rows(batch_size, process_index, process_count)
        return [self.examples("validation", VALIDATION_SEED, b * batch_size + rows) for b in range(num_batches)]


class TextPipeline(Pipeline):
    """Packed windows of a tokenized text corpus (``kind = "lm"``). The two
    streams are ``token_cache.TokenStream``s: each batch reads only its windows."""

    def __init__(self, config, tokenizer, train_tokens, validation_tokens, fingerprint, stats):
        super().__init__(config, tokenizer, fingerprint)
        self.train_tokens, self.validation_tokens = train_tokens, validation_tokens
        self.stats.update(stats)
        T = config.seq_len
        # Windows of T + 1 tokens on a grid of stride T, shifted by up to T - 1.
        self.train_windows = (len(train_tokens) - T) // T
        self.validation_windows = (len(validation_tokens) - 1) // T
        if self.train_windows < 1 or self.validation_windows < 1:
            raise ValueError(f"seq_len={T} is too long for this corpus: train holds {len(train_tokens)} "
                             f"tokens (needs {2 * T}), validation {len(validation_tokens)} (needs {T + 1})")
        self._orders: dict[tuple[int, int], tuple[int, np.ndarray]] = {}

    def epoch_order(self, seed: int, epoch: int) -> tuple[int, np.ndarray]:
        """(grid offset in tokens, permutation of window numbers) of one epoch."""
        order = self._orders.get((seed, epoch))
        if order is None:  # the prefetch thread may be here too: work on locals only
            rng = np.random.default_rng([seed, epoch])
            order = (int(rng.integers(self.seq_len)), rng.permutation(self.train_windows))
            if len(self._orders) >= 8:
                self._orders.clear()
            self._orders[(seed, epoch)] = order
        return order

    def examples(self, split, seed, indices):
        T = self.seq_len
        if split == "train":
            epochs, positions = np.divmod(indices, self.train_windows)
            starts = np.empty(len(indices), dtype=np.int64)
            for epoch in np.unique(epochs):
                offset, order = self.epoch_order(seed, int(epoch))
                chosen = epochs == epoch
                starts[chosen] = offset + order[positions[chosen]] * T
            stream = self.train_tokens
        else:
            starts = (indices % self.validation_windows) * T
            stream = self.validation_tokens
        windows = stream.read_windows(starts, T + 1).astype(np.int32)
        ones = np.ones((len(indices), T), dtype=np.float32)
        return {"inputs": np.ascontiguousarray(windows[:, :-1]), "targets": np.ascontiguousarray(windows[:, 1:]),
                "weights": ones, "input_mask": ones.copy()}


BIT_TOKENS = (ord("0"), ord("1"))  # byte ids of '0' and '1': the bits and the labels


class ClassificationTask(Pipeline):
    """PARITY (odd number of ones) and FIRST (first bit is one), as in
    "Overcoming a Theoretical Limitation of Self-Attention" (sections 2 and 4).

    Layout of one row: ``[CLS, b_1 .. b_n, PAD ...]``: CLS first (the paper's
    input CLS·w), bits as the byte ids of '0'/'1' (48/49). The label sits in
    ``targets`` at position 0 (the CLS position) as the byte id of '0' or '1'
    (``LABEL_TOKENS``); ``weights`` is 1 there only and ``input_mask`` is 0 on
    padding. The trainer reads the label from those two logits only
    (``scaling.model.loss.compute_loss`` with ``label_ids``).

    Training lengths n are uniform in [synthetic_min_length,
    synthetic_max_length], validation lengths in [synthetic_eval_min_length,
    synthetic_eval_max_length], so a model can be tested on longer strings
    than it was trained on. Each split is padded to its own longest string
    plus CLS, so training on short strings never pays for the evaluation
    length; ``seq_len`` only bounds both (it must hold the longer one).

    Strings: validation row ``i`` is drawn from ``default_rng([seed, 1, i])``.
    Training example ``i`` is string ``i`` (``synthetic_train_size=0``) or,
    with a fixed training set of K strings, string ``order[i mod K]`` where
    ``order`` is epoch ``i div K``'s permutation from ``default_rng([seed, 2,
    epoch])``; string ``j`` is drawn from ``default_rng([seed, 0, j])``. All of
    it is independent of batch size and host.
    """

    kind = "classification"
    LABEL_TOKENS = BIT_TOKENS  # the two label logits: byte ids of '0' (class 0) and '1' (class 1)

    def __init__(self, config: DataConfig):
        longest = max(config.synthetic_max_length, config.synthetic_eval_max_length)
        if config.seq_len < longest + 1:
            raise ValueError(f"seq_len={config.seq_len} must hold the longest {config.source} string "
                             f"({longest} bits) plus CLS: need seq_len >= {longest + 1}")
        settings = {name: getattr(config, name) for name in (
            "source", "synthetic_min_length", "synthetic_max_length",
            "synthetic_eval_min_length", "synthetic_eval_max_length", "synthetic_train_size")}
        settings["layout"] = "cls-first-own-padding"
        super().__init__(config, ByteTokenizer(), token_cache.settings_fingerprint(settings))

    def label(self, bits: np.ndarray) -> int:
        """The class (0 or 1) of one bit string."""
        return int(bits.sum() % 2) if self.config.source == "parity" else int(bits[0])

    def row_length(self, split: str) -> int:
        """Tokens per row of ``split``: its longest string plus CLS."""
        c = self.config
        return (c.synthetic_max_length if split == "train" else c.synthetic_eval_max_length) + 1

    def _string_rng(self, split: str, seed: int, index: int) -> np.random.Generator:
        size = self.config.synthetic_train_size
        if split != "train":
            return np.random.default_rng([seed, 1, index])
        if size:
            epoch, position = divmod(index, size)
            index = int(np.random.default_rng([seed, 2, epoch]).permutation(size)[position])
        return np.random.default_rng([seed, 0, index])

    def examples(self, split, seed, indices):
        c = self.config
        low, high = ((c.synthetic_min_length, c.synthetic_max_length) if split == "train"
                     else (c.synthetic_eval_min_length, c.synthetic_eval_max_length))
        shape = (len(indices), self.row_length(split))
        inputs = np.full(shape, self.pad_id, dtype=np.int32)
        targets = np.full(shape, self.pad_id, dtype=np.int32)
        weights = np.zeros(shape, dtype=np.float32)
        input_mask = np.zeros(shape, dtype=np.float32)
        for row, index in enumerate(indices):
            rng = self._string_rng(split, seed, int(index))
            length = int(rng.integers(low, high + 1))
            bits = rng.integers(0, 2, length)
            inputs[row, 0] = self.cls_id
            inputs[row, 1:length + 1] = BIT_TOKENS[0] + bits
            targets[row, 0] = self.LABEL_TOKENS[self.label(bits)]
            weights[row, 0] = 1.0
            input_mask[row, :length + 1] = 1.0
        return {"inputs": inputs, "targets": targets, "weights": weights, "input_mask": input_mask}


LOOKBACK_ALPHABET = np.arange(ord("a"), ord("z") + 1)  # byte ids of 'a'..'z'
LOOKBACK_COPY_RATE = 0.5


class LookbackTask(Pipeline):
    """An LM task whose only learnable dependency spans exactly
    ``lookback_distance`` (D) tokens.

    A row is ``seq_len + 1`` letters 'a'..'z' (byte ids). Every position
    t >= D is, with probability 1/2, a copy of the token at t - D; the other
    positions are fresh uniform letters. Loss weights are 1 only where the
    target is a copy, so a model that looks back exactly D tokens reaches
    zero loss, and one that cannot sees log(26) nats. Fresh letters break
    every shorter or periodic shortcut (t - 2D is a copy of t only by chance).
    """

    def __init__(self, config: DataConfig):
        if config.lookback_distance >= config.seq_len:
            raise ValueError(f"lookback_distance={config.lookback_distance} must be < seq_len={config.seq_len}")
        settings = {"source": "lookback", "seq_len": config.seq_len, "lookback_distance": config.lookback_distance,
                    "copy_rate": LOOKBACK_COPY_RATE, "alphabet": len(LOOKBACK_ALPHABET)}
        super().__init__(config, ByteTokenizer(), token_cache.settings_fingerprint(settings))

    def examples(self, split, seed, indices):
        T, D = self.seq_len, self.config.lookback_distance
        tokens = np.empty((len(indices), T + 1), dtype=np.int32)
        copy = np.empty((len(indices), T + 1), dtype=bool)
        for row, index in enumerate(indices):
            rng = np.random.default_rng([seed, int(split == "validation"), int(index)])
            tokens[row] = rng.choice(LOOKBACK_ALPHABET, T + 1)
            copy[row] = rng.random(T + 1) < LOOKBACK_COPY_RATE
        copy[:, :D] = False
        for start in range(D, T + 1, D):  # block by block: each reads only finished blocks
            stop = min(start + D, T + 1)
            tokens[:, start:stop] = np.where(copy[:, start:stop], tokens[:, start - D:stop - D],
                                             tokens[:, start:stop])
        return {"inputs": np.ascontiguousarray(tokens[:, :-1]), "targets": np.ascontiguousarray(tokens[:, 1:]),
                "weights": copy[:, 1:].astype(np.float32),
                "input_mask": np.ones((len(indices), T), dtype=np.float32)}


def build_text(config: DataConfig) -> TextPipeline:
    """A ``TextPipeline`` for a builtin / hub / local source, read from its token
    cache: ``config.cache_dir`` (pre-built; the source is never read), or else the
    local cache of this corpus, built on first use."""
    if config.cache_dir:
        cache = token_cache.open_cache(config.cache_dir, config)
    else:
        cache = token_cache.open_cache(token_cache.build_cache(config))
    return TextPipeline(config, cache.tokenizer, cache.train, cache.validation, cache.fingerprint, cache.stats)


def build(config: DataConfig) -> Pipeline:
    """The pipeline for ``config``: a ``TextPipeline``, ``ClassificationTask``
    or ``LookbackTask``."""
    if config.source in SYNTHETIC_SOURCES and config.tokenizer != "byte":
        raise ValueError(f"tokenizer={config.tokenizer!r}: synthetic source {config.source!r} uses byte ids; "
                         "set tokenizer='byte'")
    if config.source in CLASSIFICATION_SOURCES:
        return ClassificationTask(config)
    if config.source == "lookback":
        return LookbackTask(config)
    return build_text(config)


def program_arguments(data_config: DataConfig, objective: str, vocab_size: int) -> dict:
    """The keyword arguments ``scaling.model.program.build`` takes from the data, without loading any.

    ``vocab_size`` is the resolved model's (the tokenizer's base ids plus the
    special tokens, which every pipeline appends in ``SPECIAL_TOKENS`` order).
    The trainer and the TPU preflight both call this, so the preflight prices
    the very program a run trains: the two-logit loss of a classification task
    (``label_ids``), the masked objective's mask id, the random-token range.
    """
    classification = data_config.source in CLASSIFICATION_SOURCES
    masked = objective == "masked" and not classification
    special_base = vocab_size - len(SPECIAL_TOKENS)
    return {"mask_id": special_base + SPECIAL_TOKENS.index("mask") if masked else None,
            "random_token_limit": vocab_size,
            "label_ids": ClassificationTask.LABEL_TOKENS if classification else None}


def batch_digest(batch: dict[str, np.ndarray]) -> str:
    """SHA-256 hex of a batch's ``inputs`` as little-endian int32, row-major."""
    return hashlib.sha256(np.ascontiguousarray(batch["inputs"], dtype="<i4").tobytes()).hexdigest()
