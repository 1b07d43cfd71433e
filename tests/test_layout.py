"""The documentation's Layout page (docs/layout.md) names every module of the three packages once, and nothing that is gone."""

import re

from helpers import REPO

# Every package folder of the three top-level packages, subpackages included, but the sweep files'.
PACKAGES = tuple(sorted(str(init.parent.relative_to(REPO)) for top in ("scaling", "sweeps", "analysis")
                        for init in (REPO / top).rglob("__init__.py") if init.parent.name != "configs"))


def layout_entries() -> dict[str, list[str]]:
    """Module files named in the Layout block, by package folder (``scaling/`` lines open a package)."""
    page = (REPO / "docs" / "layout.md").read_text()
    block = page.split("```text", 1)[1].split("```", 1)[0]
    entries, package = {}, None
    for line in block.splitlines():
        heading = re.match(r"(\S+)/\s", line + " ")
        if heading and not line.startswith(" "):
            package = heading.group(1)
            entries.setdefault(package, [])
            continue
        module = re.match(r"  (\S+\.py)\s", line)
        if module and package is not None:
            entries[package].append(module.group(1))
    return entries


def test_every_module_has_one_line_and_every_line_a_module():
    entries = layout_entries()
    for package in PACKAGES:
        named = entries.get(package, [])
        on_disk = {path.name for path in (REPO / package).glob("*.py") if path.name != "__init__.py"}
        assert len(named) == len(set(named)), f"{package}: named twice: {sorted(n for n in named if named.count(n) > 1)}"
        assert set(named) == on_disk, (f"{package}: missing from the Layout: {sorted(on_disk - set(named))}; "
                                       f"named but gone: {sorted(set(named) - on_disk)}")
