"""A pre-tokenised token cache: tokenise a text corpus once, then train from it
on every host without the source, the hub or the tokenizer download.

Build it once, on any machine, into any local or ``gs://`` directory::

    python -m scaling.data cache --source hub --hub-name allenai/c4 --hub-config en \\
        --max-documents 3500000 --validation-fraction 0.01 --tokenizer hf:gpt2 \\
        --cache-dir gs://BUCKET/tokens/c4-gpt2

and train with ``data.cache_dir`` set to that directory (the rest of the data
config must describe the same corpus; a mismatch is refused by name).

Layout of a cache directory
    ``metadata.json``   written last, in one atomic step: its presence means the
                        cache is complete. Source description (the data config
                        fields that choose the text), tokenizer, vocabulary,
                        token dtype, document / byte / token counts per split,
                        the corpus hash and data fingerprint (exactly those of
                        ``scaling.data.pipeline`` reading the source itself), every
                        shard's size and SHA-256, and ``tokens_sha256``: the
                        SHA-256 of the list of shard hashes, in order.
    ``train-00000.npy``, ``validation-00000.npy``, ...
                        token shards: 1-D little-endian ``uint16`` arrays when
                        the vocabulary (tokenizer + 4 special ids) fits in
                        2**16 ids, ``uint32`` otherwise. Shard k of a split
                        holds documents k*D .. (k+1)*D - 1 of that split, each
                        followed by eos; concatenated, a split's shards are the
                        token stream ``scaling.data.pipeline`` packs windows from.
    ``train-00000.json``  one per shard: its token count, data offset and
                        SHA-256, written just before the shard is renamed into
                        place (what a resumed build trusts).
    ``build.json``      the plan (fingerprint, D, dtype) a resumed build must match.
    ``tokenizer.json``  the serialized tokenizer (not for ``byte``), so readers
                        need no download.

Building (``build_cache``) reads and splits the corpus (held in memory, as the
pipeline always has), computes the fingerprint, then tokenises shard by shard
with a progress bar. Interrupted, it resumes: shards already in place (and of
the size their ``.json`` records) are skipped. Run on a finished cache, it
checks every shard against its hash and rebuilds damaged ones.

Reading (``open_cache``) touches only ``metadata.json``, ``tokenizer.json``
and one directory listing; tokens are read when a batch asks for them
(``TokenStream.read_windows``). Local shards are memory-mapped, which reads
only the pages the windows touch. A cache on an object store (``gs://``) is
copied to the local disk one shard at a time, the first time a window
needs that shard (one request per shard, SHA-256 checked against the
metadata, then memory-mapped), into ``default_cache_dir()/copies/<tokens
hash>``, shared by every process and run on the host. Windows are spread
at random over the whole split, so fetching them one range each (the old
scheme, still there with ``local_copy=False``) cost one HTTP request per
window: 256 per step per run for a 256-row batch, tens of thousands per
second across a pod, against a bucket's ~5,000 reads per second to begin
with; with the copy, a process makes at most one request per shard over a
whole run (``benchmarks/bucket_io.py`` measures both).

Why hand-written ``.npy`` shards and not Grain or ArrayRecord
    Both install from PyPI (grain 0.2.18 adds array-record, absl-py,
    cloudpickle, portpicker, protobuf). ArrayRecord's unit of random access is
    a record, but a training example here is a window of seq_len + 1 tokens
    at an offset that depends on the epoch (see ``scaling.data.pipeline``), so one
    stream serves every seq_len and epoch; records of fixed windows would
    either change the batches or need a stream reassembled from record
    chunks anyway. Grain's strengths (worker pools, checkpointable iterator
    state) are not needed: a batch is a pure function of (seed, step) and a
    step's rows are a few byte ranges. ArrayRecord opens files by path, so
    pods usually mount the bucket with gcsfuse for it (MaxText ships a
    ``setup_gcsfuse.sh`` for its Grain datasets): one more service per host.
    Here ``gs://`` goes through ``etils.epath`` and ``scaling.store.storage`` like
    every other file of the project. A plain ``.npy`` stays readable with
    ``np.load`` by anyone, and exact range requests (``storage.read_ranges``)
    avoid the megabytes of read-ahead a buffered ``gs://`` file object
    fetches per seek.

Command line: ``python -m scaling.data cache --help``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import shlex
import sys
import threading

import numpy as np
from etils import epath

from scaling.config import TEXT_SOURCES, DataConfig
from scaling.data import corpus
from scaling.data.tokenizer import ByteTokenizer, HFTokenizer, build_tokenizer
from scaling.store.storage import file_sizes, is_remote, read_ranges, write_atomic

FORMAT_VERSION = "scaling-data-v1"  # bump when splitting, packing or order change (part of the fingerprint)
CACHE_FORMAT = "scaling-token-cache-v1"  # bump when the cache layout changes
SPECIAL_TOKENS = ("pad", "eos", "mask", "cls")  # ids right after the tokenizer's, in this order
METADATA, PLAN, TOKENIZER_FILE = "metadata.json", "build.json", "tokenizer.json"
DEFAULT_SHARD_DOCUMENTS = 50_000  # C4: about 22M GPT-2 tokens, 45 MB of uint16 per shard
ENCODE_BATCH = 1024  # documents per tokenizer call: bounds memory and paces the progress bar
SPLITS = ("train", "validation")


class CacheError(ValueError):
    """A token cache that is missing, incomplete, damaged or built for other data (one-line message)."""


def settings_fingerprint(settings: dict) -> str:
    """SHA-256 hex of ``settings`` (JSON, sorted keys) with the data format version."""
    text = json.dumps({"format": FORMAT_VERSION, **settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def default_cache_dir() -> pathlib.Path:
    """``$XDG_CACHE_HOME/scaling-data`` or ``~/.cache/scaling-data`` (always local): BPE
    files, and the caches built on first use when ``data.cache_dir`` is unset."""
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "scaling-data"


def token_dtype(vocab_size: int) -> np.dtype:
    """Little-endian uint16 if ids ``0 .. vocab_size - 1`` fit in 16 bits, else uint32."""
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def pack(token_lists: list[np.ndarray], eos_id: int, dtype) -> np.ndarray:
    """One token stream: each document followed by ``eos_id``."""
    if not token_lists:
        return np.zeros(0, dtype=dtype)
    eos = np.array([eos_id], dtype=dtype)
    return np.concatenate([piece for ids in token_lists for piece in (ids.astype(dtype), eos)])


def describe_source(config: DataConfig) -> dict:
    """The data config fields that choose a text corpus and its tokens (not ``seq_len``:
    one cache serves every sequence length)."""
    fields = ["source", "validation_fraction", "tokenizer"]
    if config.tokenizer == "bpe":
        fields.append("bpe_vocab_size")
    if config.source == "hub":
        fields += ["hub_name", "hub_config", "hub_split", "text_field", "max_documents"]
    elif config.source == "local":
        fields += ["paths", "text_field", "max_documents"]
    return {name: list(value) if isinstance(value, tuple) else value
            for name in fields for value in [getattr(config, name)]}


def cache_command(config: DataConfig, directory) -> str:
    """The ``python -m scaling.data cache`` command line that builds ``config``'s cache in ``directory``."""
    words = ["python", "-m", "scaling.data", "cache"]
    for name, value in describe_source(config).items():
        flag = "--" + name.replace("_", "-")
        words += [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
    return shlex.join(words + ["--cache-dir", os.fspath(directory)])


# --------------------------------------------------------------------------- Reading


class TokenStream:
    """One split's token stream, stored as shards, read by byte ranges.

    ``read_windows`` is what training uses; ``stream[a:b]`` and
    ``np.asarray(stream)`` read contiguous pieces (the latter the whole split,
    for inspection). ``bytes_read`` counts the token bytes fetched so far.
    """

    def __init__(self, directory: epath.Path, shards: list[dict], dtype: np.dtype, sizes: dict[str, int],
                 copy_dir: pathlib.Path | None = None):
        self.dtype = np.dtype(dtype)
        self.shards, self.where = shards, os.fspath(directory)
        self.paths = [directory / shard["file"] for shard in shards]
        self.data_offsets = [int(shard["data_offset"]) for shard in shards]
        counts = np.array([int(shard["tokens"]) for shard in shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)])  # token offset of each shard in the stream
        for shard, count, offset in zip(shards, counts, self.data_offsets):
            expected = offset + int(count) * self.dtype.itemsize
            found = sizes.get(shard["file"])
            if found != expected:
                state = "is missing" if found is None else f"has {found} bytes"
                raise CacheError(f"token cache {self.where} is damaged: {shard['file']} {state}, expected "
                                 f"{expected}; build it again with the same `python -m scaling.data cache` command")
        self.bytes_read = 0
        self._lock = threading.Lock()
        # Local shards are memory-mapped (no system call per window); remote ones
        # are copied to ``copy_dir`` on first use and mapped there, or, without
        # a copy_dir, read as exact byte ranges, all of a batch at once.
        self._local = not is_remote(directory)
        self.copy_dir = None if self._local else copy_dir
        self._maps: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def read_windows(self, starts, length: int) -> np.ndarray:
        """Tokens ``[s, s + length)`` for every ``s`` in ``starts``: an array [len(starts), length]."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        if len(starts) and (starts.min() < 0 or starts.max() + length > len(self)):
            raise IndexError(f"windows of {length} tokens at {starts.min()}..{starts.max()} leave the "
                             f"stream of {len(self)} tokens")
        out = np.empty((len(starts), max(length, 0)), dtype=self.dtype)
        if length <= 0 or not len(starts):
            return out
        first = np.searchsorted(self.offsets, starts, side="right") - 1
        last = np.searchsorted(self.offsets, starts + length - 1, side="right") - 1
        pieces = []  # (row, column, shard, first token in shard, end token in shard)
        for row, (start, a, b) in enumerate(zip(starts.tolist(), first.tolist(), last.tolist())):
            for k in range(a, b + 1):  # usually one shard; two where a window crosses a boundary
                low = max(start, int(self.offsets[k])) - int(self.offsets[k])
                high = min(start + length, int(self.offsets[k + 1])) - int(self.offsets[k])
                pieces.append((row, int(self.offsets[k]) + low - start, k, low, high))
        if self._local or self.copy_dir is not None:
            for row, column, k, low, high in pieces:
                out[row, column:column + high - low] = self._memory_map(k)[low:high]
        else:
            size = self.dtype.itemsize
            blobs = read_ranges([self.paths[k] for _, _, k, _, _ in pieces],
                                [self.data_offsets[k] + low * size for _, _, k, low, _ in pieces],
                                [self.data_offsets[k] + high * size for _, _, k, _, high in pieces])
            for (row, column, k, low, high), blob in zip(pieces, blobs):
                if len(blob) != (high - low) * size:
                    raise CacheError(f"short read from {self.paths[k]}: the cache changed while reading")
                out[row, column:column + high - low] = np.frombuffer(blob, dtype=self.dtype)
        with self._lock:
            self.bytes_read += out.nbytes
        return out

    def _memory_map(self, k: int) -> np.ndarray:
        """Shard ``k`` mapped read-only (a remote one from its local copy): slicing it reads only the
        pages it touches."""
        if k not in self._maps:
            with self._lock:
                if k not in self._maps:
                    count = int(self.offsets[k + 1] - self.offsets[k])
                    path = self.paths[k] if self._local else self._local_copy(k)
                    self._maps[k] = np.memmap(path, dtype=self.dtype, mode="r",
                                              offset=self.data_offsets[k], shape=(count,)) if count else \
                        np.zeros(0, dtype=self.dtype)
        return self._maps[k]

    def _local_copy(self, k: int) -> str:
        """The local copy of remote shard ``k``, fetched whole (one request) and checked if not there yet."""
        shard = self.shards[k]
        target = self.copy_dir / shard["file"]
        size = self.data_offsets[k] + int(self.offsets[k + 1] - self.offsets[k]) * self.dtype.itemsize
        if target.exists() and target.stat().st_size == size:  # written only after its hash was checked
            return str(target)
        data = self.paths[k].read_bytes()
        body = data[self.data_offsets[k]:]
        if len(data) != size or hashlib.sha256(body).hexdigest() != shard["sha256"]:
            raise CacheError(f"token cache {self.where} is damaged: {shard['file']} does not match its recorded "
                             "size and hash; build it again with the same `python -m scaling.data cache` command")
        self.copy_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(target, data)  # several processes of a host may copy the same shard: last rename wins
        return str(target)

    def __getitem__(self, item) -> np.ndarray:
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError("a TokenStream takes contiguous slices, e.g. stream[a:b]")
        start, stop, _ = item.indices(len(self))
        return self.read_windows([start], max(stop - start, 0))[0]

    def __array__(self, dtype=None, copy=None):
        tokens = self[:]
        return tokens if dtype is None else tokens.astype(dtype)


@dataclasses.dataclass
class TokenCache:
    """An opened cache: its metadata, tokenizer and the two splits' streams."""

    directory: epath.Path
    metadata: dict
    tokenizer: object
    train: TokenStream
    validation: TokenStream

    @property
    def fingerprint(self) -> str:
        return self.metadata["fingerprint"]

    @property
    def stats(self) -> dict:
        """Corpus sizes for run records (the keys ``scaling.data.pipeline`` always reported)."""
        m = self.metadata
        stats = {"corpus_sha256": m["corpus_sha256"]}
        for kind in ("documents", "bytes", "tokens"):
            stats.update({f"{split}_{kind}": m[kind][split] for split in SPLITS})
        return stats


def _check_agrees(metadata: dict, config: DataConfig, where: str) -> None:
    built, wanted = metadata["source"], describe_source(config)
    for name in [*built, *(name for name in wanted if name not in built)]:  # source first
        if built.get(name) != wanted.get(name):
            raise CacheError(f"token cache {where} was built with {name}={built.get(name)!r} but the config has "
                             f"data.{name}={wanted.get(name)!r}; point data.cache_dir at a cache of this data or "
                             f"build one: {cache_command(config, where)}")


def open_cache(directory, config: DataConfig | None = None, *, local_copy: bool = True) -> TokenCache:
    """Open the complete cache in ``directory`` (local or ``gs://``), reading only its
    metadata, tokenizer file and listing. With ``config``, refuse (``CacheError``) a cache
    whose source description differs from ``describe_source(config)``. A remote cache's
    shards are copied to the local disk as windows need them (``local_copy=False``: each
    window is read as a byte range instead, one request each)."""
    directory = epath.Path(directory)
    where = os.fspath(directory)
    metadata_path = directory / METADATA
    if not metadata_path.exists():
        build = cache_command(config, where) if config is not None else "python -m scaling.data cache ..."
        if (directory / PLAN).exists():
            raise CacheError(f"token cache {where} is incomplete (its build stopped before writing {METADATA}); "
                             f"finish it by running the build again: {build}")
        raise CacheError(f"no token cache at {where} (no {METADATA}); build it once with: {build}")
    try:
        metadata = json.loads(metadata_path.read_text())
    except json.JSONDecodeError as error:
        raise CacheError(f"token cache {where}: {METADATA} is not valid JSON ({error.msg})") from None
    if metadata.get("format") != CACHE_FORMAT:
        raise CacheError(f"token cache {where} has format {metadata.get('format')!r}, this code reads "
                         f"{CACHE_FORMAT!r}; build it again")
    if config is not None:
        _check_agrees(metadata, config, where)
    if metadata["tokenizer"] == "byte":
        tokenizer = ByteTokenizer()
    else:
        import tokenizers

        tokenizer = HFTokenizer(tokenizers.Tokenizer.from_str((directory / TOKENIZER_FILE).read_text()),
                                metadata["tokenizer"])
    if tokenizer.identity != metadata["tokenizer_identity"]:
        raise CacheError(f"token cache {where}: {TOKENIZER_FILE} is not the tokenizer the tokens were made with")
    sizes = file_sizes(directory)
    dtype = np.dtype(metadata["dtype"])
    copy_dir = default_cache_dir() / "copies" / metadata["tokens_sha256"][:32] if local_copy else None
    streams = [TokenStream(directory, metadata["shards"][split], dtype, sizes, copy_dir) for split in SPLITS]
    return TokenCache(directory, metadata, tokenizer, *streams)


# --------------------------------------------------------------------------- Building


def _read_json(path: epath.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}"


def _finished_shard(directory: epath.Path, name: str, documents: int, dtype: np.dtype) -> dict | None:
    """The record of a shard already in place and of the size it records, else None."""
    info = _read_json(directory / f"{name}.json")
    shard = directory / f"{name}.npy"
    if info is None or info.get("documents") != documents or not shard.exists():
        return None
    return info if shard.stat().length == info["data_offset"] + info["tokens"] * dtype.itemsize else None


def _write_shard(directory: epath.Path, name: str, texts: list[str], tokenizer, eos_id: int, dtype, bar) -> dict:
    pieces = []
    for begin in range(0, len(texts), ENCODE_BATCH):
        batch = texts[begin:begin + ENCODE_BATCH]
        pieces.extend(tokenizer.encode_batch(batch))
        bar.update(len(batch))
    tokens = pack(pieces, eos_id, dtype)
    buffer = io.BytesIO()
    np.save(buffer, tokens, allow_pickle=False)
    data = buffer.getvalue()
    info = {"file": f"{name}.npy", "documents": len(texts), "tokens": int(len(tokens)),
            "data_offset": len(data) - tokens.nbytes, "sha256": hashlib.sha256(tokens.tobytes()).hexdigest()}
    # The record goes first, the shard's final name last: a crash between leaves no shard (it is written again).
    write_atomic(directory / f"{name}.json", json.dumps(info).encode())
    write_atomic(directory / info["file"], data)
    return info


def _damaged_shards(directory: epath.Path, metadata: dict) -> list[str]:
    """Shards of a finished cache whose bytes do not match their recorded size and hash."""
    damaged = []
    for split in SPLITS:
        for shard in metadata["shards"][split]:
            try:
                data = (directory / shard["file"]).read_bytes()
            except FileNotFoundError:
                damaged.append(shard["file"])
                continue
            body = data[shard["data_offset"]:]
            expected = shard["tokens"] * np.dtype(metadata["dtype"]).itemsize
            if len(body) != expected or hashlib.sha256(body).hexdigest() != shard["sha256"]:
                damaged.append(shard["file"])
    return damaged


def build_cache(config: DataConfig, directory=None, documents_per_shard: int = DEFAULT_SHARD_DOCUMENTS,
                show_progress: bool = False, texts: list[str] | None = None) -> epath.Path:
    """Tokenise ``config``'s text corpus into a cache in ``directory`` and return the directory.

    ``texts``: the corpus' documents, in source order, when the caller already holds
    them (``scaling.data.corpus_build`` has just written them to the file ``config`` names);
    they must be what reading ``config``'s source gives, since the metadata describes
    that source. Without it, the source is read.

    ``directory`` defaults to ``default_cache_dir() / "tokens-<fingerprint[:32]>"``.
    Resumes an interrupted build of the same data; on a finished cache, checks
    every shard's hash and rebuilds damaged shards (with a warning). Refuses
    (``CacheError``) a directory holding a cache or partial build of other data.
    """
    if config.source not in TEXT_SOURCES:
        raise ValueError(f"source={config.source!r}: only text sources {TEXT_SOURCES} have token caches")
    if documents_per_shard < 1:
        raise ValueError(f"documents_per_shard={documents_per_shard} must be >= 1")
    from tqdm import tqdm

    if texts is None:
        texts = corpus.load_documents(config, show_progress=show_progress)
    elif len(texts) < 2:
        raise ValueError(f"texts: {len(texts)} documents given; need at least 2")
    train, validation = corpus.split_documents(texts, config.validation_fraction)
    del texts
    text_hash = corpus.corpus_hash(train, validation)
    tokenizer = build_tokenizer(config.tokenizer, train, text_hash, config.bpe_vocab_size,
                                default_cache_dir())
    fingerprint = settings_fingerprint({"corpus": text_hash, "tokenizer": tokenizer.identity,
                                        "validation_fraction": config.validation_fraction})
    directory = epath.Path(directory or default_cache_dir() / f"tokens-{fingerprint[:32]}")
    where = os.fspath(directory)
    vocab_size = tokenizer.base_vocab_size + len(SPECIAL_TOKENS)
    dtype = token_dtype(vocab_size)
    plan = {"format": CACHE_FORMAT, "fingerprint": fingerprint, "documents_per_shard": documents_per_shard,
            "dtype": dtype.str}

    finished = _read_json(directory / METADATA)
    if finished is not None:
        if finished.get("fingerprint") != fingerprint:
            raise CacheError(f"{where} already holds a token cache of other data (fingerprint "
                             f"{str(finished.get('fingerprint'))[:12]}, this corpus {fingerprint[:12]}); "
                             "choose another --cache-dir")
        damaged = _damaged_shards(directory, finished)
        if not damaged:
            return directory
        print(f"warning: token cache {where}: {', '.join(damaged)} do(es) not match the recorded hash; "
              "rebuilding them", file=sys.stderr)
        for name in damaged:
            (directory / name).unlink(missing_ok=True)
        (directory / METADATA).unlink(missing_ok=True)
        plan["documents_per_shard"] = finished["documents_per_shard"]
    started = _read_json(directory / PLAN)
    if started is not None and started != plan:
        differ = ", ".join(f"{key} {started.get(key)!r} (now {plan[key]!r})" for key in plan
                           if started.get(key) != plan[key])
        raise CacheError(f"{where} holds a partial token cache built with {differ}; "
                         "resume it with the same settings, or delete it, or choose another --cache-dir")
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / PLAN, json.dumps(plan).encode())
    if not isinstance(tokenizer, ByteTokenizer):
        write_atomic(directory / TOKENIZER_FILE, tokenizer.tokenizer.to_str().encode())

    per_shard = plan["documents_per_shard"]
    eos_id = tokenizer.base_vocab_size + SPECIAL_TOKENS.index("eos")
    shards = {}
    with tqdm(total=len(train) + len(validation), unit="doc", desc=f"tokenising into {where}",
              disable=not show_progress, file=sys.stderr) as bar:
        for split, split_texts in zip(SPLITS, (train, validation)):
            shards[split] = []
            for index in range(-(-len(split_texts) // per_shard)):
                chunk = split_texts[index * per_shard:(index + 1) * per_shard]
                name = _shard_name(split, index)
                info = _finished_shard(directory, name, len(chunk), dtype)
                if info is None:
                    info = _write_shard(directory, name, chunk, tokenizer, eos_id, dtype, bar)
                else:
                    bar.update(len(chunk))
                shards[split].append(info)

    def count(split, what):
        return sum(shard[what] for shard in shards[split])

    metadata = {
        "format": CACHE_FORMAT, "fingerprint": fingerprint, "source": describe_source(config),
        "tokenizer": config.tokenizer, "tokenizer_identity": tokenizer.identity,
        "base_vocab_size": tokenizer.base_vocab_size, "vocab_size": vocab_size, "dtype": dtype.str,
        "corpus_sha256": text_hash, "documents_per_shard": per_shard,
        "documents": {split: len(texts) for split, texts in zip(SPLITS, (train, validation))},
        "bytes": {split: sum(len(text.encode("utf-8")) for text in texts)
                  for split, texts in zip(SPLITS, (train, validation))},
        "tokens": {split: count(split, "tokens") for split in SPLITS},
        "tokens_sha256": hashlib.sha256(json.dumps([[s["file"], s["tokens"], s["sha256"]] for split in SPLITS
                                                    for s in shards[split]]).encode()).hexdigest(),
        "shards": shards,
    }
    write_atomic(directory / METADATA, json.dumps(metadata, indent=1).encode())
    return directory
