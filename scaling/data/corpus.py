"""The built-in English corpus: the prose of the Python 3.11 documentation.

What it is
    Every page of the official Python 3.11.2 documentation (tutorial, library
    and language reference, HOWTOs, FAQs, "What's New" for 2.0 to 3.11, C API,
    installing and extending guides), reduced to plain English prose: code
    and literal blocks, doctests, tables, index entries and reStructuredText
    markup are removed; function signatures, notes and version remarks stay.
    Each section of a page (the text under one heading) is one document.
    About 7.4 MB of text in about 4,200 documents.

Why this source
    It is long-form, human-written English, free to redistribute (PSF
    License 2.0, see ``corpus_data/LICENSE``), and it comes from a pinned,
    public artefact, so anyone can rebuild it byte for byte. Docstrings of
    installed packages were the alternative; they are mostly parameter lists
    and code, and they change with every package version.

Where it comes from
    The reStructuredText sources (``html/_sources/**/*.rst.txt``) shipped in
    Debian's ``python3.11-doc`` package, version 3.11.2-6+deb12u9. The
    result ships xz-compressed in ``corpus_data/``, so it is available
    offline right after ``pip install`` and its content hash (and therefore
    every run's data fingerprint) is the same on every machine. Rebuild with::

        apt-get download python3.11-doc=3.11.2-6+deb12u9
        dpkg-deb -x python3.11-doc_*.deb /tmp/pydoc
        python -m scaling.corpus /tmp/pydoc/usr/share/doc/python3.11/html/_sources

``python -m scaling.corpus build`` (``scaling.data.corpus_build``) builds a larger
corpus, about 100 MB, from installed Debian documentation packages.

This module also reads the documents of the other text sources (Hugging
Face hub datasets, local files) and splits any text corpus into train and
validation documents; tokenizing and batching are ``scaling.data.pipeline``'s job.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import lzma
import pathlib
import re

from scaling.config import DataConfig

CORPUS_DIR = pathlib.Path(__file__).resolve().parent / "corpus_data"
CORPUS_FILE = CORPUS_DIR / "python-3.11-docs.jsonl.xz"


def builtin_documents(path: pathlib.Path = CORPUS_FILE) -> list[tuple[str, str]]:
    """The built-in corpus as (document id, text) pairs, in a fixed order.

    A document id looks like ``library/functools#2`` (page, section number).
    Loading takes about 0.15 s (1.6 MB of xz to 7.4 MB of text).
    """
    if not path.exists():
        raise FileNotFoundError(f"built-in corpus file {path} is missing; reinstall the package")
    with lzma.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [(row["id"], row["text"]) for row in rows]


# ---------------------------------------------------------------------------
# Documents of any text source, and the train/validation split

LOCAL_BUILDERS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def _texts_from_stream(dataset, field: str, limit: int, where: str, show_progress: bool = False) -> list[str]:
    from tqdm import tqdm

    texts = []
    rows = itertools.islice(dataset, limit)
    for row in tqdm(rows, total=limit, unit="doc", desc=f"reading {where}", disable=not show_progress):
        if field not in row:
            raise ValueError(f"text_field={field!r} is not a column of {where}: columns are {sorted(row)}")
        if row[field]:
            texts.append(row[field])
    if len(texts) < 2:
        raise ValueError(f"{where} yielded {len(texts)} non-empty documents; need at least 2")
    return texts


def check_hub_reachable(config: DataConfig, timeout_seconds: float = 5.0) -> None:
    """``ValueError`` (one line) when ``config`` streams a dataset from the Hugging Face Hub and the Hub's
    host takes no connection within ``timeout_seconds``: said at once, not after a minute of the client's
    retries. Nothing is checked when the Hub is not needed (another source, a pre-built ``cache_dir``, a
    local folder as ``hub_name``, ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``) or when a proxy is
    configured (the connection is then the proxy's to make)."""
    import os
    import socket
    from urllib.parse import urlparse

    if config.source != "hub" or config.cache_dir or os.path.isdir(os.path.expanduser(config.hub_name)):
        return
    if any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("HF_HUB_OFFLINE",
                                                                                "HF_DATASETS_OFFLINE")):
        return
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout_seconds).close()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ValueError(f"data.hub_name {config.hub_name!r}: cannot reach the Hugging Face Hub at "
                         f"{constants.ENDPOINT} ({reason}); check the network, set HF_HUB_OFFLINE=1 to read "
                         "a dataset already in the local cache, or pass a pre-built token cache as "
                         "data.cache_dir") from None


def load_hub_documents(config: DataConfig, show_progress: bool = False) -> list[str]:
    """Up to ``config.max_documents`` texts streamed from a Hugging Face
    dataset (hub name, or a local folder laid out like a hub dataset repo)."""
    import datasets  # heavy import, only for the sources that need it

    where = f"dataset {config.hub_name!r} (config {config.hub_config or None!r}, split {config.hub_split!r})"
    try:
        dataset = datasets.load_dataset(config.hub_name, config.hub_config or None,
                                        split=config.hub_split, streaming=True)
        return _texts_from_stream(dataset, config.text_field, config.max_documents, where, show_progress)
    except ValueError:
        raise
    except Exception as error:  # datasets raises many types for missing names, splits, network
        raise ValueError(f"could not stream {where}: {type(error).__name__}: {error}") from error


def load_local_documents(config: DataConfig, show_progress: bool = False) -> list[str]:
    """Up to ``config.max_documents`` texts from local text / jsonl / parquet
    files (one kind per config), read through ``datasets``."""
    import datasets

    kinds = {LOCAL_BUILDERS.get(pathlib.Path(p).suffix.lower()) for p in config.paths}
    if None in kinds or len(kinds) != 1:
        raise ValueError(f"paths={list(config.paths)!r}: need files of one kind, with suffixes "
                         f"{sorted(LOCAL_BUILDERS)}")
    missing = [p for p in config.paths if not pathlib.Path(p).is_file()]
    if missing:
        raise ValueError(f"paths: no such file(s) {missing}")
    builder = kinds.pop()
    options = {"sample_by": "paragraph"} if builder == "text" else {}
    dataset = datasets.load_dataset(builder, data_files=[str(p) for p in config.paths], split="train",
                                    streaming=True, **options)
    field = "text" if builder == "text" else config.text_field
    return _texts_from_stream(dataset, field, config.max_documents, f"files {list(config.paths)}", show_progress)


def load_documents(config: DataConfig, show_progress: bool = False) -> list[str]:
    """The texts of a text source (builtin, hub or local), in source order; with
    ``show_progress``, a progress bar (stderr) while a hub or local stream is read."""
    if config.source == "builtin":
        return [text for _, text in builtin_documents()]
    if config.source == "hub":
        return load_hub_documents(config, show_progress)
    if config.source == "local":
        return load_local_documents(config, show_progress)
    raise ValueError(f"source={config.source!r} is not a text source")


def validation_key(text: str) -> float:
    """A document's place in [0, 1) for the split: a hash of its text."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2.0**64


def split_documents(texts: list[str], validation_fraction: float) -> tuple[list[str], list[str]]:
    """(train, validation) texts, each in source order; validation gets the
    documents whose ``validation_key`` is below ``validation_fraction``. A
    tiny corpus still gets one validation document (the lowest key)."""
    keys = [validation_key(text) for text in texts]
    is_validation = [key < validation_fraction for key in keys]
    if not any(is_validation):
        is_validation[min(range(len(keys)), key=keys.__getitem__)] = True
    train = [t for t, v in zip(texts, is_validation) if not v]
    validation = [t for t, v in zip(texts, is_validation) if v]
    if not train:
        raise ValueError(f"all {len(texts)} documents fell into validation; the corpus is too small")
    return train, validation


def corpus_hash(train: list[str], validation: list[str]) -> str:
    """SHA-256 hex of the split corpus (document boundaries included)."""
    digest = hashlib.sha256()
    for name, texts in (("train", train), ("validation", validation)):
        digest.update(f"{name}:{len(texts)}\n".encode())
        for text in texts:
            data = text.encode("utf-8")
            digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


# ---------------------------------------------------------------------------
# Building the corpus file from reStructuredText sources (run once, by hand).

# Directives whose argument is itself readable text (a signature or a name):
# the argument stays as a line and the indented body is kept.
_SIGNATURE_DIRECTIVES = {
    "function", "method", "class", "attribute", "data", "exception", "decorator",
    "decoratormethod", "classmethod", "staticmethod", "abstractmethod",
    "coroutinefunction", "coroutinemethod", "awaitablefunction", "describe", "object",
    "opcode", "cmdoption", "option", "envvar", "pdbcommand", "2to3fixer",
    "c:function", "c:member", "c:type", "c:var", "c:macro", "c:struct", "c:data",
    "rubric",
}
# Directives whose body is prose (admonitions and the like): body kept.
_BODY_DIRECTIVES = {
    "note", "warning", "seealso", "impl-detail", "important", "caution", "attention",
    "tip", "hint", "danger", "error", "admonition", "topic", "sidebar", "only",
    "glossary", "epigraph", "availability", "deprecated", "deprecated-removed",
    "versionadded", "versionchanged",
}
_VERSION_WORDS = {
    "versionadded": "New in version {}",
    "versionchanged": "Changed in version {}",
    "deprecated": "Deprecated since version {}",
    "deprecated-removed": "Deprecated since version {}, will be removed in version {}",
}
_ADORNMENT = re.compile(r"^([=\-~^\"'`#*+:.<>_])\1{2,}\s*$")
_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:.-]+)::\s*(.*)$")
_COMMENT = re.compile(r"^(\s*)\.\.(\s|$)")
_SIMPLE_TABLE_BORDER = re.compile(r"^\s*=+( +=+)+\s*$")
_OPTION_LINE = re.compile(r"^\s*:[\w -]+:")
_BULLET = re.compile(r"^([*+-]|#\.|\d+\.|\(?[a-z0-9]\))\s")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _skip_indented(lines: list[str], start: int, indent: int) -> int:
    """Index of the first line at or after ``start`` that is non-blank and
    indented at most ``indent`` columns (the end of a nested block)."""
    i = start
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > indent):
        i += 1
    return i


def _is_heading(lines: list[str], i: int) -> bool:
    title, below = lines[i], lines[i + 1] if i + 1 < len(lines) else ""
    return (bool(title.strip()) and _indent(title) == 0 and not _ADORNMENT.match(title)
            and bool(_ADORNMENT.match(below)) and len(below.strip()) >= len(title.strip()) - 2)


def split_sections(source: str) -> list[tuple[str, list[str]]]:
    """Cut one reStructuredText page into (heading, kept lines) sections,
    dropping code, literal blocks, doctests, tables, comments and
    non-prose directives. Lines keep their indentation for paragraph joining."""
    lines = source.expandtabs(8).splitlines()
    sections: list[tuple[str, list[str]]] = [("", [])]
    i = 0
    while i < len(lines):
        line, stripped = lines[i], lines[i].strip()
        indent = _indent(line)
        if _ADORNMENT.match(line) and i + 2 < len(lines) and _is_heading(lines, i + 1):
            i += 1  # overline of an over-and-under heading
            continue
        if _is_heading(lines, i):
            sections.append((stripped, []))
            i += 2
            continue
        if _ADORNMENT.match(line):  # a transition line
            i += 1
            continue
        directive = _DIRECTIVE.match(line)
        if directive:
            name, argument = directive.group(2), directive.group(3).strip()
            body = i + 1
            while body < len(lines) and _OPTION_LINE.match(lines[body]) and _indent(lines[body]) > indent:
                body += 1
            if name in _VERSION_WORDS:
                count = 2 if name == "deprecated-removed" else 1
                parts = argument.split(None, count)
                words = _VERSION_WORDS[name].format(*parts[:count], *[""] * (count - len(parts[:count])))
                rest = " ".join(parts[count:])
                sections[-1][1].append(" " * indent + (f"{words}: {rest}" if rest else f"{words}."))
                i = body
            elif name in _SIGNATURE_DIRECTIVES or name in _BODY_DIRECTIVES:
                if argument and name not in _BODY_DIRECTIVES:
                    sections[-1][1].extend([" " * indent + argument, ""])
                i = body
            else:
                i = _skip_indented(lines, i + 1, indent)
            continue
        if _COMMENT.match(line):
            i = _skip_indented(lines, i + 1, indent)
            continue
        if stripped.startswith(">>>"):
            while i < len(lines) and lines[i].strip():
                i += 1
            continue
        if stripped.startswith(("+-", "+=")):  # grid table
            while i < len(lines) and lines[i].strip():
                i += 1
            continue
        if _SIMPLE_TABLE_BORDER.match(line):
            i += 1
            while i < len(lines) and not (_SIMPLE_TABLE_BORDER.match(lines[i])
                                          and (i + 1 == len(lines) or not lines[i + 1].strip())):
                i += 1
            i += 1
            continue
        if stripped.endswith("::"):  # paragraph introducing a literal block
            text = stripped[:-2].rstrip()
            if text:
                sections[-1][1].append(" " * indent + text + ("" if stripped.endswith(" ::") else ":"))
            i = _skip_indented(lines, i + 1, indent)
            sections[-1][1].append("")
            continue
        sections[-1][1].append(line)
        i += 1
    return sections


_INLINE_RULES = [
    (re.compile(r":(pep|rfc):`(\d+)`"), lambda m: f"{m.group(1).upper()} {m.group(2)}"),
    (re.compile(r":[\w:.+-]+:`~?!?([^`<]*?)\s*<[^`>]*>`"), r"\1"),  # :ref:`title <target>`
    (re.compile(r":[\w:.+-]+:`~[\w.]*?\.?([\w()]+)`"), r"\1"),  # :func:`~a.b.c` -> c
    (re.compile(r":[\w:.+-]+:`!?([^`]*)`"), r"\1"),  # :role:`text`
    (re.compile(r"``(.+?)``"), r"\1"),
    (re.compile(r"`([^`<]*?)\s*<[^`>]*>`__?"), r"\1"),  # `link text <url>`_
    (re.compile(r"`([^`]+)`__?"), r"\1"),
    (re.compile(r"`([^`]+)`"), r"\1"),
    (re.compile(r"\*\*(\S(?:.*?\S)?)\*\*"), r"\1"),
    (re.compile(r"(?<![\w*\\])\*(\S(?:[^*]*?\S)?)\*(?![\w*])"), r"\1"),
    (re.compile(r"\\ "), ""),
    (re.compile(r"\\(.)"), r"\1"),
    (re.compile(r"  +"), " "),
]


def clean_inline(text: str) -> str:
    """Remove reStructuredText inline markup (roles, literals, emphasis, links)."""
    for pattern, replacement in _INLINE_RULES:
        text = pattern.sub(replacement, text)
    return text.strip()


def paragraphs(lines: list[str]) -> list[str]:
    """Join kept lines into paragraphs: wrapped lines become one line, bullet
    items and definition-list terms start lines of their own."""
    out: list[str] = []
    block: list[str] = []
    previous_indent = None
    for line in lines + [""]:
        if not line.strip():
            if block:
                out.append("\n".join(clean_inline(part) for part in block if part.strip()))
            block, previous_indent = [], None
            continue
        stripped, indent = line.strip(), _indent(line)
        starts_item = bool(_BULLET.match(stripped))
        is_definition = previous_indent is not None and indent > previous_indent and len(block) == 1 \
            and not _BULLET.match(block[0])
        if not block or starts_item or is_definition:
            block.append(stripped)
        else:
            block[-1] += " " + stripped
        previous_indent = indent
    return [p for p in out if p]


def page_documents(page: str, source: str) -> list[tuple[str, str]]:
    """One page's (document id, text) pairs: one per non-empty section, the
    heading first, paragraphs separated by blank lines."""
    documents = []
    for number, (heading, lines) in enumerate(split_sections(source)):
        body = paragraphs(lines)
        if sum(map(len, body)) < 80:  # headings with no prose of their own
            continue
        text = "\n\n".join(([clean_inline(heading)] if heading else []) + body)
        documents.append((f"{page}#{number}", text))
    return documents


def build_corpus_file(sources_dir: pathlib.Path, out_path: pathlib.Path = CORPUS_FILE) -> dict:
    """Rebuild the shipped corpus file from the ``_sources`` folder of a
    Sphinx HTML build of the Python docs. Returns document and byte counts."""
    pages = sorted(sources_dir.rglob("*.rst.txt"))
    if not pages:
        raise ValueError(f"no *.rst.txt files under {sources_dir}")
    documents = []
    for path in pages:
        page = path.relative_to(sources_dir).as_posix().removesuffix(".rst.txt")
        documents.extend(page_documents(page, path.read_text(encoding="utf-8")))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # Fixed preset and no timestamps in the xz stream: the file is reproducible.
    with lzma.open(out_path, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        for doc_id, text in documents:
            f.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
    return {"pages": len(pages), "documents": len(documents),
            "text_bytes": sum(len(text.encode()) for _, text in documents),
            "file_bytes": out_path.stat().st_size}
