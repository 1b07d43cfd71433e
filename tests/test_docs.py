"""The short README and the documentation site (docs/, mkdocs.yml): what the README must keep, what the
site must hold, and the strict build (links and anchors included) where the docs extra is installed."""

import importlib.util
import re
import subprocess
import sys

import pytest

from helpers import REPO

README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 230, "the README is the short tour; move the rest to docs/"


def test_the_readme_links_every_results_folder():
    for folder in sorted(p for p in (REPO / "results").iterdir() if p.is_dir()):
        assert f"](results/{folder.name}/" in README, f"the README's Results do not link results/{folder.name}/"


def test_every_local_link_of_the_readme_resolves():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith(("http://", "https://")):
            assert (REPO / target).exists(), f"README links {target}, which is not in the repository"


def test_no_figure_that_goes_stale_by_itself():
    # Test counts and durations change with every commit; a page stating one is wrong soon after.
    stale = re.compile(r"\b\d[\d,]* tests\b|\b\d+ minutes? \d+ seconds?\b|\btook \d")
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        found = stale.findall(page.read_text())
        assert not found, f"{page.name} states {found}: a figure that goes stale unless a test checks it"


def test_two_plot_commands_never_share_a_folder():
    # `plot` names its files by figure, not by sweep: a second sweep into the same folder replaces the first's.
    outs = re.findall(r"analysis plot \S+ --out (\S+)", README)
    assert len(outs) >= 2 and len(set(outs)) == len(outs), outs


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = (REPO / "mkdocs.yml").read_text()
    nav = set(re.findall(r"^\s+- [^\n]*?:\s*(\S+\.md)\s*$", config, flags=re.M))
    assert nav == {page.name for page in DOCS.glob("*.md")}


def test_moved_sections_live_in_the_docs():
    # The long README's sections that the short one only points to.
    for page, heading in [("layout.md", "# Layout"), ("pods.md", "# Run on a TPU pod"), ("preflight.md", "# The preflight"),
                          ("packs.md", "# Packs"), ("parametrizations.md", "# Parametrizations"),
                          ("results.md", "# Results"), ("runs-and-leases.md", "# Launchers, leases and stops")]:
        assert (DOCS / page).read_text().startswith(heading), page


def test_the_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip('needs the docs extra: pip install -e ".[docs]"')
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "training" / "index.html").exists()
