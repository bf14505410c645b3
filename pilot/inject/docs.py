"""`python -m pilot.inject.docs` refreshes the annotation table in docs/injection.md from
pilot/inject/annotations.py (tests/unit/test_inject.py fails when they differ)."""

from __future__ import annotations

import sys

from pilot.inject.annotations import markdown_table
from pilot.inject.deploy import REPO

DOC = REPO / "docs" / "injection.md"
BEGIN, END = "<!-- annotations:begin -->\n", "<!-- annotations:end -->"


def main() -> int:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + BEGIN + markdown_table() + END + tail)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
