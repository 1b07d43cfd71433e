"""A larger offline English corpus, built from Debian documentation packages (or any folder of text).

    apt-get install python3.11-doc=3.11.2-6+deb12u9 linux-doc-6.1=6.1.192-2 maxima-doc=5.46.0-11 \\
        octave-doc=7.3.0-2 postgresql-doc-15=15.20-0+deb12u1 perl-doc=5.36.0-7+deb12u4 \\
        debian-reference-en=2.100 bash-doc=5.2.15-2 python-django-doc=3:3.2.25-0+deb12u7 \\
        sqlite3-doc=3.40.1-2+deb12u2 git-doc=1:2.39.5-0+deb12u3 dict-foldoc=20230119-1 \\
        dict-gcide=0.48.5+nmu2 dict-wn=1:3.0-37
    python -m scaling.corpus build --out ~/.cache/scaling-data/debian-docs-prose \\
        --fingerprint results/gpu_depth/corpus_fingerprint.json

The versions are pinned: the committed fingerprint was built from exactly these (Debian 12; all on
deb.debian.org on 2026-11-28, older ones stay on snapshot.debian.org), and ``--fingerprint`` verifies a
build against it, failing on the first field that differs (``--overwrite-fingerprint`` replaces it).

What it does, in order
    1. Reads every source's files in sorted order and reduces them to prose:
       reStructuredText (Sphinx ``_sources``) with ``scaling.data.corpus``'s rules,
       HTML with the standard library's ``html.parser`` (code, tables,
       navigation, scripts dropped), Perl POD (verbatim code paragraphs
       dropped, formatting codes resolved), and the GCIDE dictionary (pronunciation
       and source markers dropped; consecutive entries grouped into documents
       of at least ``DICTIONARY_DOCUMENT_CHARS``). A document is one section
       (the text under one heading); sections with under ``MIN_DOCUMENT_CHARS``
       of text are dropped.
    2. De-duplicates: a document whose whitespace-normalised text was already
       seen (in any source, sources in the listed order) is dropped.
    3. Writes ``documents.jsonl`` (one ``{"id", "source", "text"}`` per line),
       and builds a byte-level token cache from it in ``tokens/``
       (``scaling.data.token_cache``; the train/validation split is the usual
       one, by document, on a hash of its text).
    4. Packs ``tokens/`` into ``tokens.tar.xz`` (sorted members, zeroed
       times and owners: the same bytes on every machine for the same
       packages), which is what travels to a machine without network.
    5. Writes ``LICENSES`` (each package's Debian copyright file and the
       common licences it points to) and ``fingerprint.json`` (sizes per
       source, package versions, hashes) beside them.

The data config that reads this corpus is ``data_config()``: a ``local`` source
whose path, ``documents.jsonl``, is relative to the corpus directory. Training
sets ``data.cache_dir`` to the unpacked ``tokens/`` (not part of the run id), so
the jsonl file is never read there.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import html
import json
import os
import pathlib
import re
import subprocess
import tarfile
from html.parser import HTMLParser

from scaling.config import DataConfig
from scaling.data import corpus

DOCUMENTS_FILE, TOKENS_DIR, ARCHIVE, LICENSES_FILE, FINGERPRINT_FILE = (
    "documents.jsonl", "tokens", "tokens.tar.xz", "LICENSES", "fingerprint.json")
MIN_DOCUMENT_CHARS = 200  # shorter sections are headings, link lists or stubs, not prose
DICTIONARY_DOCUMENT_CHARS = 8000  # dictionary entries are grouped into documents of about this size
MAX_DOCUMENTS = 10_000_000  # data.max_documents of the corpus' config: above any build's count
VALIDATION_FRACTION = 0.01
ARCHIVE_LIMIT_BYTES = 60 * 2**20  # what may travel to an offline machine with the code
KINDS = ("rst", "html", "pod", "dictd", "folder")


@dataclasses.dataclass(frozen=True)
class Source:
    """One source of documents: a Debian package's files (``package`` set) or a plain folder.

    ``kind`` chooses the reader: ``rst`` (Sphinx ``*.rst.txt`` sources),
    ``html``, ``pod``, ``dictd`` (a dictd ``.dict.dz`` dictionary) or
    ``folder`` (each file by its suffix). ``patterns`` are globs under ``root``.
    """

    name: str
    kind: str
    root: str
    patterns: tuple[str, ...]
    package: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"source {self.name}: kind={self.kind!r} is invalid: allowed {', '.join(KINDS)}")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise ValueError(f"source name={self.name!r} is invalid: allowed letters, digits, '.', '_', '-'")

    def files(self) -> list[pathlib.Path]:
        """The source's files, sorted (symbolic links to files elsewhere in the list read once)."""
        root = pathlib.Path(self.root)
        found = sorted({path for pattern in self.patterns for path in root.glob(pattern) if path.is_file()})
        return found


# The Debian 12 packages of the default build (all in main: their licences allow
# redistribution, see each package's /usr/share/doc/<package>/copyright).
# gnuplot-doc is left out: its licence lets modified versions travel only as patches.
DEBIAN_SOURCES = (
    Source("python-docs", "rst", "/usr/share/doc/python3.11/html/_sources", ("**/*.rst.txt",), "python3.11-doc"),
    Source("linux-docs", "rst", "/usr/share/doc/linux-doc-6.1/html/_sources", ("**/*.rst.txt",), "linux-doc-6.1"),
    Source("maxima-manual", "html", "/usr/share/doc/maxima-doc/html", ("*.html",), "maxima-doc"),
    Source("octave-manual", "html", "/usr/share/doc/octave", ("octave.html/*.html", "liboctave.html/*.html"),
           "octave-doc"),
    Source("postgresql-docs", "html", "/usr/share/doc/postgresql-doc-15/html", ("*.html",), "postgresql-doc-15"),
    Source("perl-docs", "pod", "/usr/share/perl/5.36.0/pod", ("*.pod",), "perl-doc"),
    Source("debian-reference", "html", "/usr/share/debian-reference", ("*.en.html",), "debian-reference-en"),
    Source("bash-manual", "html", "/usr/share/doc/bash", ("bashref.html",), "bash-doc"),
    Source("django-docs", "html", "/usr/share/doc/python-django-doc/html", ("*.html", "[!_]*/**/*.html"),
           "python-django-doc"),
    Source("sqlite-docs", "html", "/usr/share/doc/sqlite3", ("*.html", "[!_]*/**/*.html"), "sqlite3-doc"),
    Source("git-docs", "html", "/usr/share/doc/git-doc", ("**/*.html",), "git-doc"),
    Source("foldoc-dictionary", "dictd", "/usr/share/dictd", ("foldoc.dict.dz",), "dict-foldoc"),
    Source("gcide-dictionary", "dictd", "/usr/share/dictd", ("gcide.dict.dz",), "dict-gcide"),
    Source("wordnet-dictionary", "dictd", "/usr/share/dictd", ("wn.dict.dz",), "dict-wn"),
)


def data_config(seq_len: int = 512) -> DataConfig:
    """The data config of a built corpus: byte tokens, 1% of documents held out, ``documents.jsonl``
    relative to the corpus directory (read only when no ``cache_dir`` is set, from there)."""
    return DataConfig(source="local", paths=(DOCUMENTS_FILE,), text_field="text", max_documents=MAX_DOCUMENTS,
                      validation_fraction=VALIDATION_FRACTION, tokenizer="byte", seq_len=seq_len)


# ---------------------------------------------------------------------------
# Readers: one file's text -> (section number, text) documents


def _tidy(paragraphs_: list[str]) -> str:
    kept = [re.sub(r"[ \t\r\f\v]+", " ", p).strip() for p in paragraphs_]
    return "\n\n".join(p for p in kept if p)


class _ProseParser(HTMLParser):
    """HTML -> sections of paragraphs. Headings h1-h3 start a section; code, tables, scripts and
    navigation blocks are skipped whole."""

    SKIP_TAGS = {"script", "style", "pre", "table", "head", "nav", "svg", "math", "select", "textarea"}
    SKIP_CLASSES = re.compile(r"\b(nav\w*|header|footer|section-toc|contents|shortcontents|toc|sidebar|related|"
                              r"breadcrumbs?|index-\w+|copiable-anchor|headerlink)\b")
    BLOCK_TAGS = {"p", "div", "li", "dt", "dd", "br", "blockquote", "section", "tr", "ul", "ol", "dl", "hr",
                  "h4", "h5", "h6", "caption", "figure", "article", "body"}
    SECTION_TAGS = {"h1", "h2", "h3"}
    VOID_TAGS = {"br", "hr", "img", "meta", "link", "input", "col", "area", "base", "wbr", "source"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.sections: list[list[str]] = [[]]
        self.current: list[str] = []
        self.skipping: tuple[str, int] | None = None  # (tag, nesting) of the element being skipped

    def _flush(self):
        text = "".join(self.current).strip()
        if text:
            self.sections[-1].append(text)
        self.current = []

    def handle_starttag(self, tag, attrs):
        if self.skipping is not None:
            if tag == self.skipping[0] and tag not in self.VOID_TAGS:
                self.skipping = (tag, self.skipping[1] + 1)
            return
        classes = dict(attrs).get("class") or ""
        if tag in self.SKIP_TAGS or (tag not in self.VOID_TAGS and self.SKIP_CLASSES.search(classes)):
            self._flush()
            self.skipping = (tag, 1)
        elif tag in self.SECTION_TAGS:
            self._flush()
            self.sections.append([])
        elif tag in self.BLOCK_TAGS:
            self._flush()

    def handle_endtag(self, tag):
        if self.skipping is not None:
            if tag == self.skipping[0]:
                depth = self.skipping[1] - 1
                self.skipping = None if depth == 0 else (tag, depth)
            return
        if tag in self.SECTION_TAGS or tag in self.BLOCK_TAGS:
            self._flush()

    def handle_data(self, data):
        if self.skipping is None:
            self.current.append(re.sub(r"\s+", " ", data))


def html_documents(text: str) -> list[str]:
    """The prose sections of one HTML page (heading first, paragraphs separated by blank lines)."""
    parser = _ProseParser()
    parser.feed(text)
    parser.close()
    parser._flush()
    return [_tidy(section) for section in parser.sections]


def rst_documents(text: str) -> list[str]:
    """The prose sections of one reStructuredText page (``scaling.data.corpus``'s rules)."""
    return [document for _, document in corpus.page_documents("page", text)]


_POD_CODE = re.compile(r"([A-Z])<(?:<+\s(.*?)\s>+|([^<>]*))>", re.S)


def _pod_inline(text: str) -> str:
    def resolve(match):
        code, body = match.group(1), match.group(2) if match.group(2) is not None else match.group(3)
        if code in ("X", "Z"):
            return ""
        if code == "E":
            return {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}.get(body, html.unescape(f"&{body};"))
        if code == "L":
            body = body.split("|", 1)[0] if "|" in body else body.replace('/"', " ").replace('"', "")
        return body

    for _ in range(8):  # nested codes resolve inside out
        new = _POD_CODE.sub(resolve, text)
        if new == text:
            break
        text = new
    return text


def pod_documents(text: str) -> list[str]:
    """The prose sections of one Perl POD file: =head1/=head2 start sections, verbatim (indented)
    paragraphs are code and dropped, =begin/=end and =for blocks dropped."""
    sections: list[list[str]] = [[]]
    skipping = False
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        if not block.strip():
            continue
        if block.startswith("="):
            parts = block[1:].split(None, 1)
            command, rest = parts[0], " ".join(parts[1].split()) if len(parts) > 1 else ""
            if command == "begin":
                skipping = True
            elif command == "end":
                skipping = False
            elif command in ("head1", "head2"):
                sections.append([_pod_inline(rest)])
            elif command in ("head3", "head4", "item") and rest and not skipping:
                sections[-1].append(_pod_inline(rest))
            continue
        if skipping or block[0] in " \t":
            continue
        sections[-1].append(_pod_inline(" ".join(block.split())))
    return [_tidy(section) for section in sections]


# Lines that are only a source or date marker: [1913 Webster], [PJC], [WordNet 1.5], (1994-11-29)
_DICT_MARKER = re.compile(r"^\s*(\[[^\]\n]*\]|\(\d{4}-\d\d-\d\d\))\s*$", re.M)
_DICT_LISTS = re.compile(r"\[(syn|ant|also|see):[^\]]*\]", re.S)  # WordNet's word lists, not prose


def dictd_documents(text: str) -> list[str]:
    """GCIDE-style dictd text: entries start at column 0; source markers, pronunciation
    (``\\A*buse"\\``) and cross-reference braces are dropped; consecutive entries are grouped
    into documents of at least ``DICTIONARY_DOCUMENT_CHARS`` characters."""
    entries = re.split(r"\n(?=\S)", text)
    documents, group, size = [], [], 0
    for entry in entries:
        if entry.startswith("00-database") or entry.startswith("00database"):
            continue
        entry = _DICT_LISTS.sub("", _DICT_MARKER.sub("", entry))
        entry = re.sub(r"\\[^\\\n]*\\", "", entry).replace("{", "").replace("}", "")
        paragraphs_ = [" ".join(p.split()) for p in re.split(r"\n\s*\n", entry)]
        cleaned = _tidy(paragraphs_)
        if not cleaned:
            continue
        group.append(cleaned)
        size += len(cleaned)
        if size >= DICTIONARY_DOCUMENT_CHARS:
            documents.append("\n\n".join(group))
            group, size = [], 0
    if group:
        documents.append("\n\n".join(group))
    return documents


def plain_documents(text: str) -> list[str]:
    """A plain text or Markdown file: one document, paragraphs re-joined."""
    return [_tidy([" ".join(p.split()) for p in re.split(r"\n\s*\n", text)])]


def folder_documents(text: str, path: pathlib.Path) -> list[str]:
    """A file of a plain folder, read by its suffix."""
    name = path.name.lower()
    if name.endswith((".html", ".htm")):
        return html_documents(text)
    if name.endswith((".rst", ".rst.txt")):
        return rst_documents(text)
    if name.endswith(".pod"):
        return pod_documents(text)
    return plain_documents(text)


READERS = {"rst": rst_documents, "html": html_documents, "pod": pod_documents, "dictd": dictd_documents,
           "folder": folder_documents}
FOLDER_SUFFIXES = (".txt", ".text", ".md", ".rst", ".html", ".htm", ".pod")


def folder_source(path: pathlib.Path) -> Source:
    """A folder of text files (``FOLDER_SUFFIXES``) as a source named after the folder."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", path.resolve().name) or "folder"
    return Source(name, "folder", str(path), tuple(f"**/*{suffix}" for suffix in FOLDER_SUFFIXES))


def _read_text(path: pathlib.Path) -> str:
    data = path.read_bytes()
    if path.suffix in (".gz", ".dz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def source_documents(source: Source) -> list[tuple[str, str]]:
    """(document id, text) of every document of ``source``, in file order; id ``name/relative/path#k``."""
    files = source.files()
    if not files:
        raise ValueError(f"source {source.name}: no files match {list(source.patterns)} under {source.root}"
                         + (f" (apt-get install {source.package})" if source.package else ""))
    reader = READERS[source.kind]
    documents = []
    for path in files:
        text = _read_text(path)
        found = reader(text, path) if source.kind == "folder" else reader(text)
        page = path.relative_to(source.root).as_posix()
        documents += [(f"{source.name}/{page}#{k}", doc) for k, doc in enumerate(found)
                      if len(doc) >= MIN_DOCUMENT_CHARS]
    return documents


# ---------------------------------------------------------------------------
# Building


def package_version(package: str) -> str:
    """The installed Debian version of ``package`` ("" when dpkg does not know it)."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    except FileNotFoundError:
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def licence_text(sources: list[Source]) -> str:
    """The LICENSES file: per source its package, version and copyright file, then the common
    licences those files point to (``/usr/share/common-licenses/...``)."""
    parts = ["Licences of the texts in this corpus. Each text is the prose of the named package's "
             "documentation with its markup removed; the package (Debian 12, section main) is its source.\n"]
    common = set()
    for source in sources:
        parts.append("=" * 78 + f"\nSource {source.name}: {source.root}")
        candidates = []
        if source.package:
            parts[-1] += f"\nDebian package {source.package} {package_version(source.package)}"
            candidates.append(pathlib.Path("/usr/share/doc") / source.package / "copyright")
        root = pathlib.Path(source.root)
        candidates += sorted(p for p in root.glob("*") if re.match(r"(LICEN[CS]E|COPYING|copyright)", p.name))
        texts = [p.read_text(encoding="utf-8", errors="replace") for p in candidates if p.is_file()]
        if not texts:
            texts = ["NO LICENCE FILE FOUND: check the licence of these texts before redistributing them."]
        parts += texts
        for text in texts:
            common.update(re.findall(r"/usr/share/common-licenses/([\w.+-]*\w)", text))
    for name in sorted(common):
        path = pathlib.Path("/usr/share/common-licenses") / name
        if path.is_file():
            parts.append("=" * 78 + f"\n{path}\n\n" + path.read_text(encoding="utf-8", errors="replace"))
    return "\n\n".join(parts) + "\n"


def normalised_key(text: str) -> bytes:
    """What de-duplication compares: SHA-256 of the text with all whitespace runs made one space."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).digest()


def collect(sources: list[Source]) -> tuple[list[dict], dict]:
    """Documents of all sources, de-duplicated in source order, and per-source counts
    (files, documents kept, duplicates dropped, prose bytes kept)."""
    seen: set[bytes] = set()
    rows, per_source = [], {}
    for source in sources:
        files = source.files()
        kept = dropped = size = 0
        for doc_id, text in source_documents(source):
            key = normalised_key(text)
            if key in seen:
                dropped += 1
                continue
            seen.add(key)
            rows.append({"id": doc_id, "source": source.name, "text": text})
            kept += 1
            size += len(text.encode("utf-8"))
        per_source[source.name] = {"package": source.package, "version": package_version(source.package)
                                   if source.package else "", "root": source.root, "files": len(files),
                                   "documents": kept, "duplicates_dropped": dropped, "prose_bytes": size}
    return rows, per_source


def pack_directory(directory: pathlib.Path, archive: pathlib.Path, preset: int = 6) -> None:
    """``directory`` as a reproducible ``.tar.xz``: members sorted, named ``<dir name>/...``,
    times and owners zeroed, modes 0644/0755."""
    members = sorted(p for p in directory.rglob("*"))
    tmp = archive.with_name(archive.name + ".partial")
    with tarfile.open(tmp, "w:xz", preset=preset, format=tarfile.PAX_FORMAT) as tar:
        for path in [directory, *members]:
            name = directory.name if path == directory else f"{directory.name}/{path.relative_to(directory).as_posix()}"
            info = tar.gettarinfo(str(path), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if path.is_dir() else 0o644
            if path.is_file():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    os.replace(tmp, archive)


def unpack_archive(archive: pathlib.Path, destination: pathlib.Path) -> pathlib.Path:
    """Unpack a ``tokens.tar.xz`` into ``destination``; returns the token cache directory in it."""
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(destination, filter="data")
    return destination / TOKENS_DIR


def _sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build(sources: list[Source], out: pathlib.Path, show_progress: bool = False, preset: int = 6) -> dict:
    """Build the corpus of ``sources`` into ``out`` (documents, token cache, archive, licences,
    fingerprint) and return the fingerprint dict. Raises ``ValueError`` when a source has no files
    or the archive exceeds ``ARCHIVE_LIMIT_BYTES``."""
    from scaling.data import token_cache

    out.mkdir(parents=True, exist_ok=True)
    rows, per_source = collect(sources)
    if len(rows) < 2:
        raise ValueError(f"the sources gave {len(rows)} documents of at least {MIN_DOCUMENT_CHARS} characters; "
                         "need 2 or more")
    if len(rows) > MAX_DOCUMENTS:
        raise ValueError(f"{len(rows)} documents exceed MAX_DOCUMENTS={MAX_DOCUMENTS}")
    documents = out / DOCUMENTS_FILE
    with open(documents, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / LICENSES_FILE).write_text(licence_text(sources), encoding="utf-8")
    config = data_config()
    tokens_dir = token_cache.build_cache(config, out / TOKENS_DIR, show_progress=show_progress,
                                         texts=[row["text"] for row in rows])
    metadata = token_cache.open_cache(tokens_dir, config).metadata
    archive = out / ARCHIVE
    pack_directory(pathlib.Path(tokens_dir), archive, preset)
    size = archive.stat().st_size
    fingerprint = {
        "format": "scaling-corpus-build-v1",
        "sources": per_source,
        "documents": len(rows), "prose_bytes": sum(s["prose_bytes"] for s in per_source.values()),
        "split": {"validation_fraction": config.validation_fraction, "documents": metadata["documents"],
                  "bytes": metadata["bytes"], "tokens": metadata["tokens"]},
        "corpus_sha256": metadata["corpus_sha256"], "data_fingerprint": metadata["fingerprint"],
        "tokens_sha256": metadata["tokens_sha256"],
        "documents_sha256": _sha256_file(documents),
        "archive": {"file": ARCHIVE, "bytes": size, "mib": round(size / 2**20, 2), "sha256": _sha256_file(archive),
                    "xz_preset": preset},
        "licenses_sha256": _sha256_file(out / LICENSES_FILE),
        "data_config": {"source": config.source, "paths": list(config.paths), "max_documents": config.max_documents,
                        "validation_fraction": config.validation_fraction, "tokenizer": config.tokenizer},
    }
    (out / FINGERPRINT_FILE).write_text(json.dumps(fingerprint, indent=1) + "\n")
    if size > ARCHIVE_LIMIT_BYTES:
        raise ValueError(f"{archive} is {size / 2**20:.1f} MiB, over the {ARCHIVE_LIMIT_BYTES / 2**20:.0f} MiB that "
                         "may travel with the code; build from fewer sources")
    return fingerprint
