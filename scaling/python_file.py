"""What a user's Python file defines: a training config (``config()``) or a sweep (``sweep()`` or ``SWEEP``).

The trainer's ``--config FILE.py`` and the launcher's sweep files are both
Python files run as they are; one loader gives both the same one-line errors
(no traceback) for a missing file, a file that raises, one that defines
nothing usable, and one that returns the wrong kind of object.
"""

from __future__ import annotations

import pathlib
import runpy


class PythonFileError(ValueError):
    """A Python file that cannot be loaded; the message is one line naming the file."""


def load(path, *, function: str, constant: str | None = None, expected: type, what: str):
    """Run the Python file ``path`` and return ``function()`` if it defines that, else its ``constant``.

    ``what`` names the file in messages (``sweep file``, ``--config``). Raises
    ``PythonFileError`` with one line when the file is missing, raises,
    defines neither name, or gives something that is not an ``expected``.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise PythonFileError(f"{what} {path}: no such file")
    try:
        namespace = runpy.run_path(str(path), run_name="__loaded_file__")  # not __main__: its script part stays off
        if callable(namespace.get(function)):
            value = namespace[function]()
        elif constant is not None and constant in namespace:
            value = namespace[constant]
        else:
            wanted = f"neither {function}() nor {constant}" if constant else f"no {function}()"
            raise PythonFileError(f"{what} {path}: defines {wanted}")
    except PythonFileError:
        raise
    except Exception as error:  # noqa: BLE001 - anything a user's file raises becomes one line
        from scaling.store.rundir import one_line

        raise PythonFileError(f"{what} {path}: {one_line(error)}") from None
    if not isinstance(value, expected):
        raise PythonFileError(f"{what} {path}: {function}() gave a {type(value).__name__}, not a "
                              f"{expected.__module__}.{expected.__qualname__}")
    return value
