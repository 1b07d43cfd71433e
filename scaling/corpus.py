"""``python -m scaling.corpus``: rebuild the built-in corpus file from the Python docs' sources
(``scaling.data.corpus``), or, with ``build``, build a larger corpus from Debian documentation packages or
folders of text (``scaling.data.corpus_build``; also ``python -m scaling.corpus_build``)."""

from __future__ import annotations

import json
import pathlib
import sys

from scaling import cli
from scaling.data import corpus, corpus_build
from scaling.entry import prepare_process


def main(argv=None) -> None:
    """``python -m scaling.corpus SOURCES_DIR`` rebuilds the built-in corpus file;
    ``python -m scaling.corpus build ...`` builds a larger corpus (``build_main``)."""
    prepare_process()  # before JAX starts its backend or a storage client
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["build"]:
        build_main(argv[1:])
        return
    parser = cli.Parser(
        prog="python -m scaling.corpus",
        description="Rebuild the built-in corpus file from the Python docs' reStructuredText sources "
                    "(see this module's docstring for where to get them). `python -m scaling.corpus build "
                    "--help`: build a larger corpus from Debian documentation packages or folders of text.")
    parser.add_argument("sources_dir", type=pathlib.Path,
                        help="the html/_sources folder of the python3.11-doc package")
    parser.add_argument("--out", type=pathlib.Path, default=corpus.CORPUS_FILE, help="output .jsonl.xz path")
    args = parser.parse_args(argv)
    if not args.sources_dir.is_dir():
        parser.error(f"sources_dir {args.sources_dir} is not a directory")
    try:
        print(json.dumps(corpus.build_corpus_file(args.sources_dir, args.out)))
    except ValueError as error:
        parser.error(str(error))


def build_main(argv=None, prog: str = "python -m scaling.corpus build") -> None:
    """``python -m scaling.corpus build`` (also ``python -m scaling.corpus_build``)."""
    parser = cli.Parser(
        prog=prog,
        description="Build an English prose corpus from installed Debian documentation packages (default) or "
                    "folders of text: strip markup, de-duplicate, write documents, a byte-level token cache, "
                    "its .tar.xz, LICENSES and fingerprint.json into --out (see scaling/data/corpus_build.py).")
    parser.add_argument("--out", type=pathlib.Path, required=True,
                        help="output directory, outside the repository, e.g. ~/.cache/scaling-data/debian-docs-prose")
    parser.add_argument("--folder", type=pathlib.Path, action="append", default=[], metavar="DIR",
                        help="a folder of .txt/.md/.rst/.html/.pod files to use instead of the Debian "
                             "packages (repeatable)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="only these Debian sources (repeatable): "
                             f"{', '.join(s.name for s in corpus_build.DEBIAN_SOURCES)}")
    parser.add_argument("--fingerprint", type=pathlib.Path, metavar="PATH",
                        help="the committed fingerprint to verify the build against (e.g. "
                             "results/gpu_depth/corpus_fingerprint.json): a difference is an error naming the "
                             "first field that differs; a missing file is written")
    parser.add_argument("--overwrite-fingerprint", action="store_true",
                        help="write the build's fingerprint over --fingerprint's file even when they differ")
    parser.add_argument("--xz-preset", type=int, default=6, choices=range(10), metavar="0-9",
                        help="xz compression level of tokens.tar.xz (default 6)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if args.folder and args.only:
        parser.error("give --folder or --only, not both")
    if args.overwrite_fingerprint and not args.fingerprint:
        parser.error("--overwrite-fingerprint needs --fingerprint PATH")
    known = {s.name: s for s in corpus_build.DEBIAN_SOURCES}
    unknown = [name for name in args.only if name not in known]
    if unknown:
        parser.error(f"--only {unknown}: unknown source; choose from {', '.join(known)}")
    for folder in args.folder:
        if not folder.is_dir():
            parser.error(f"--folder {folder}: not a directory")
    sources = ([corpus_build.folder_source(f) for f in args.folder] if args.folder
               else [known[name] for name in args.only] if args.only else list(corpus_build.DEBIAN_SOURCES))
    try:
        fingerprint = corpus_build.build(sources, args.out.expanduser(), show_progress=not args.quiet,
                                         preset=args.xz_preset)
    except ValueError as error:
        parser.error(str(error))
    if args.fingerprint:
        problem = keep_fingerprint(fingerprint, args.fingerprint, args.overwrite_fingerprint)
        if problem:
            parser.error(problem)
    lines = [f"{name:18s} {s['prose_bytes'] / 1e6:8.2f} MB  {s['documents']:7d} documents  "
             f"({s['duplicates_dropped']} duplicates dropped)" for name, s in fingerprint["sources"].items()]
    print("\n".join(lines))
    print(f"total {fingerprint['prose_bytes'] / 1e6:.2f} MB of prose in {fingerprint['documents']} documents; "
          f"{args.out / corpus_build.ARCHIVE}: {fingerprint['archive']['mib']} MiB; data fingerprint "
          f"{fingerprint['data_fingerprint'][:16]}")


def first_difference(built, committed, where: str = "") -> str | None:
    """The dotted path of the first field where ``built`` and ``committed`` (JSON values) differ, with both
    values, or None when they are equal."""
    if isinstance(built, dict) and isinstance(committed, dict):
        for key in sorted(set(built) | set(committed)):
            found = first_difference(built.get(key), committed.get(key), f"{where}.{key}" if where else key)
            if found:
                return found
        return None
    if built != committed:
        return f"{where or 'the fingerprint'}: built {built!r}, committed {committed!r}"
    return None


def keep_fingerprint(fingerprint: dict, path: pathlib.Path, overwrite: bool) -> str | None:
    """Verify the build's ``fingerprint`` against the committed file ``path``: None when they agree (or the
    file did not exist and was written, or ``overwrite`` wrote it), else one line saying where they differ."""
    if path.exists() and not overwrite:
        try:
            committed = json.loads(path.read_text())
        except ValueError as error:
            return f"--fingerprint {path}: unreadable JSON ({error}); --overwrite-fingerprint replaces it"
        difference = first_difference(fingerprint, committed)
        if difference:
            return (f"the built corpus is not the committed one ({path}): {difference}; install the pinned "
                    "package versions, or replace the file with --overwrite-fingerprint")
        print(f"verified against {path}: identical")
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fingerprint, indent=1) + "\n")
    print(f"wrote {path}")
    return None


if __name__ == "__main__":
    main()
