"""Dotted overrides of a config from the command line (``--set optim.peak_lr=1e-3``).

Each assignment is checked against the config's fields, with the nearest
valid keys suggested for a typo, and the result is validated as a whole by
``scaling.config.from_dict``, so a bad value names its field.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from scaling.config import from_dict, to_dict


def _parse(text: str, current: Any) -> Any:
    """The value of ``--set key=TEXT`` for a field now holding ``current``:
    text fields keep the text, list fields split it at commas, the others read
    it as JSON (numbers, true/false, null) when it is, for validation to type."""
    if isinstance(current, str):
        return text
    if isinstance(current, list):
        return [part for part in text.split(",") if part]
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # "no", "False": pydantic reads these booleans itself


def override(config, assignments: list[str]):
    """Apply ``key.sub=value`` strings to a config, returning a new validated one."""
    data = to_dict(config)
    for assignment in assignments:
        key, equals, text = assignment.partition("=")
        if not equals:
            raise ValueError(f"override {assignment!r} must look like key=value, e.g. optim.peak_lr=1e-3")
        *sections, leaf = key.split(".")
        node = data
        for part in sections:
            node = node.get(part)
            if not isinstance(node, dict):
                raise ValueError(f"override {key!r}: {part!r} is not a config section{_near(key, data)}")
        if leaf not in node:
            raise ValueError(f"override {key}: unknown field{_near(key, data)}")
        if isinstance(node.get(leaf), dict):
            raise ValueError(f"override {key!r}: {key} is a config section; set one of its fields, "
                             f"e.g. {key}.{next(iter(node[leaf]))}=...")
        current, value = node.get(leaf), _parse(text, node.get(leaf))
        if isinstance(value, bool) and isinstance(current, (int, float)) and not isinstance(current, bool):
            # pydantic would read true as 1: a flag given to a number field is a mistake, not a count
            raise ValueError(f"override {key}={text}: {key} is a number (now {current}), not true/false")
        node[leaf] = value
    return from_dict(type(config), data)


def dotted_keys(data: dict, prefix: str = "") -> list[str]:
    """Every field of a nested config dict as a ``--set`` key (``model.num_heads``), in order."""
    keys = []
    for name, value in data.items():
        keys += dotted_keys(value, f"{prefix}{name}.") if isinstance(value, dict) else [prefix + name]
    return keys


def _near(key: str, data: dict) -> str:
    """``"; did you mean model.num_heads?"``: the ``--set`` keys nearest ``key`` (whole key or its last
    part), or a pointer to the command that lists them all."""
    keys = dotted_keys(data)
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
    near = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    near += [by_leaf[leaf] for leaf in difflib.get_close_matches(key.rsplit(".", 1)[-1], list(by_leaf), n=3,
                                                                 cutoff=0.7) if by_leaf[leaf] not in near]
    return f"; did you mean {' or '.join(near[:3])}?" if near else "; `depth-width-train config` lists every key"
