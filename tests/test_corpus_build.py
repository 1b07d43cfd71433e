"""``python -m scaling.corpus build``: the readers (HTML, POD, dictd), and a whole build of a small folder."""

import hashlib
import json
import os
import tarfile

import pytest

from scaling import corpus as corpus_cli
from scaling.data import corpus, corpus_build, token_cache

HTML = """<html><head><title>T</title><style>p {color: red}</style><script>var x = 1;</script></head>
<body><div class="navheader"><a href="a.html">Prev</a> Up Next</div>
<h1>First heading</h1><p>This paragraph is prose, with <code>inline code</code> &amp; an entity.</p>
<pre>for i in range(3):
    print(i)</pre>
<table><tr><td>cell text</td></tr></table>
<h2>Second <a class="headerlink" href="#x">¶</a></h2><p>More prose<br>on two lines.</p><ul><li>one item</li></ul>
<div class="navfooter">Footer navigation</div></body></html>"""

POD = """=head1 NAME

perlfoo - B<bold> and I<italic> and C<< $x->y >> and L<perlsyn/"Loops"> and L<the text|perlop>

=head2 Details

Wrapped text
over lines with E<lt>angleE<gt>.

    my $code = 1;  # a verbatim paragraph

=begin html

<p>only for html</p>

=end html

=item An item

=cut
"""

DICTD = """00-database-info
     This file was converted.
Abuse \\A*buse"\\, v. t. To put to a wrong use; to misapply.
      [1913 Webster]

   2. To use ill. See {Misuse}.
      [1913 Webster]
Abacus \\Ab"a*cus\\, n. A table for counting. [syn: {counting frame}]
      (1994-11-29)
"""


def test_html_keeps_prose_and_drops_code_tables_navigation():
    documents = corpus_build.html_documents(HTML)
    text = "\n".join(documents)
    assert "This paragraph is prose, with inline code & an entity." in text
    assert "More prose\n\non two lines." in text and "one item" in text
    for gone in ("print(i)", "cell text", "Prev", "Footer navigation", "color: red", "var x", "¶"):
        assert gone not in text
    assert [d.split("\n")[0] for d in documents if d] == ["First heading", "Second"]


def test_pod_resolves_codes_and_drops_verbatim_and_begin_blocks():
    documents = corpus_build.pod_documents(POD)
    text = "\n".join(documents)
    assert "perlfoo - bold and italic and $x->y and perlsyn Loops and the text" in text
    assert "Wrapped text over lines with <angle>." in text and "An item" in text
    assert "my $code" not in text and "only for html" not in text
    assert documents[2].startswith("Details")


def test_dictd_drops_markers_and_groups_entries(monkeypatch):
    documents = corpus_build.dictd_documents(DICTD)
    assert len(documents) == 1  # two short entries, grouped into one document
    text = documents[0]
    assert text.startswith("Abuse , v. t. To put to a wrong use")
    for gone in ("[1913 Webster]", "database", "\\", "{", "counting frame", "1994-11-29"):
        assert gone not in text
    monkeypatch.setattr(corpus_build, "DICTIONARY_DOCUMENT_CHARS", 10)
    assert len(corpus_build.dictd_documents(DICTD)) == 2


def test_source_validates_kind_and_name():
    with pytest.raises(ValueError, match="kind='pdf' is invalid"):
        corpus_build.Source("x", "pdf", "/", ("*",))
    with pytest.raises(ValueError, match="source name='a b' is invalid"):
        corpus_build.Source("a b", "html", "/", ("*",))


def test_build_cache_refuses_fewer_than_two_given_texts(tmp_path):
    with pytest.raises(ValueError, match="1 documents given"):
        token_cache.build_cache(corpus_build.data_config(), tmp_path / "t", texts=["only one"])


def write_folder(root, documents: int = 12):
    """A folder of plain, Markdown, reStructuredText and HTML files (Python-docs prose), a duplicate, a licence."""
    root.mkdir(parents=True)
    texts = [text for _, text in corpus.builtin_documents()[:documents]]
    for index, text in enumerate(texts):
        suffix = (".txt", ".md", ".rst")[index % 3]
        (root / f"doc{index:02d}{suffix}").write_text(text)
    (root / "copy.txt").write_text(texts[0])  # an exact duplicate of doc00.txt: dropped
    (root / "page.html").write_text(HTML.replace("This paragraph is prose", "x " * 120 + "prose"))
    (root / "LICENSE").write_text("Test licence: redistribute freely.\n")
    return texts


def build_folder(tmp_path, name="out"):
    out = tmp_path / name
    corpus_cli.build_main(["--folder", str(tmp_path / "texts"), "--out", str(out), "--quiet",
                       "--fingerprint", str(tmp_path / f"{name}-fingerprint.json")])
    return out


def test_build_of_a_folder_is_complete_reproducible_and_agrees_with_reading_the_source(tmp_path, capsys,
                                                                                          monkeypatch):
    write_folder(tmp_path / "texts")
    out = build_folder(tmp_path)
    printed = capsys.readouterr().out
    assert "texts" in printed and "MB of prose" in printed
    fingerprint = json.loads((out / "fingerprint.json").read_text())
    assert json.loads((tmp_path / "out-fingerprint.json").read_text()) == fingerprint
    source = fingerprint["sources"]["texts"]
    assert source["duplicates_dropped"] == 1 and source["files"] == 14
    rows = [json.loads(line) for line in (out / "documents.jsonl").read_text().splitlines()]
    assert len(rows) == fingerprint["documents"] == source["documents"]
    assert sum(len(r["text"].encode()) for r in rows) == source["prose_bytes"] == fingerprint["prose_bytes"]
    assert not any("<" in r["text"] and "</" in r["text"] for r in rows)  # no markup left
    assert "Test licence: redistribute freely." in (out / "LICENSES").read_text()
    archive = out / "tokens.tar.xz"
    assert fingerprint["archive"]["bytes"] == archive.stat().st_size
    assert fingerprint["archive"]["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    assert {m.name for m in members} >= {"tokens/metadata.json", "tokens/train-00000.npy"}
    assert all(m.mtime == 0 and m.uid == 0 for m in members)

    # The archive unpacks to a cache that the corpus' data config opens, with the fingerprint recorded.
    cache_dir = corpus_build.unpack_archive(archive, tmp_path / "unpacked")
    opened = token_cache.open_cache(cache_dir, corpus_build.data_config())
    assert opened.fingerprint == fingerprint["data_fingerprint"]
    assert len(opened.train) + len(opened.validation) == sum(fingerprint["split"]["tokens"].values())
    # Reading documents.jsonl itself (from the corpus directory, as the config's path says) gives the same data.
    monkeypatch.chdir(out)
    texts = corpus.load_documents(corpus_build.data_config())
    assert texts == [r["text"] for r in rows]
    again = token_cache.build_cache(corpus_build.data_config(), tmp_path / "from-source")
    assert token_cache.open_cache(again).fingerprint == fingerprint["data_fingerprint"]

    # A second build of the same folder is byte for byte the same archive.
    monkeypatch.chdir(tmp_path)
    second = json.loads((build_folder(tmp_path, "again") / "fingerprint.json").read_text())
    assert second["archive"]["sha256"] == fingerprint["archive"]["sha256"]


def test_build_refuses_an_archive_over_the_limit_and_bad_arguments(tmp_path, monkeypatch, capsys):
    write_folder(tmp_path / "texts", documents=4)
    monkeypatch.setattr(corpus_build, "ARCHIVE_LIMIT_BYTES", 100)
    with pytest.raises(SystemExit):
        build_folder(tmp_path)
    assert "over the 0 MiB" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        corpus_cli.build_main(["--folder", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert "not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        corpus_cli.build_main(["--only", "no-such-source", "--out", str(tmp_path / "o")])
    assert "unknown source" in capsys.readouterr().err
    missing = corpus_build.Source("gone", "html", str(tmp_path / "empty"), ("*.html",), "some-doc")
    with pytest.raises(ValueError, match="apt-get install some-doc"):
        corpus_build.source_documents(missing)


def test_corpus_module_dispatches_build(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(corpus_cli, "build_main", lambda argv: seen.append(argv))
    corpus_cli.main(["build", "--out", os.fspath(tmp_path)])
    assert seen == [["--out", os.fspath(tmp_path)]]
