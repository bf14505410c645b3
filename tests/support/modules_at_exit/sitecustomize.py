"""A test-only hook (tests/unit/test_file_mode_imports.py): put first on a child's PYTHONPATH, it
writes the names of every module the process imported, as a JSON list, to $PILOT_TEST_MODULES_OUT
when the interpreter exits. At exit, so imports made while serving and shutting down count too."""

from __future__ import annotations

import atexit
import json
import os
import sys

_OUT = os.environ.get("PILOT_TEST_MODULES_OUT")


def _write() -> None:
    assert _OUT is not None  # registered only then
    with open(_OUT, "w") as f:
        json.dump(sorted(sys.modules), f)


if _OUT:
    atexit.register(_write)
