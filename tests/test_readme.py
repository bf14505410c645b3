"""The README and docs/ stand on their own: every link points at a file of this repository, and
none leaves it (a fresh clone is all a reader has)."""

from __future__ import annotations

import re

from tests.support.control_plane import REPO_ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_and_docs_link_only_into_the_repository():
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text()
        for target in LINK.findall(text):
            path = target.split("#", 1)[0]
            if re.match(r"[a-z]+:", target) or path.startswith("/") or ".." in path.split("/"):
                broken.append(f"{page.name}: {target} leaves the repository")
            elif path and not (page.parent / path).exists():
                broken.append(f"{page.name}: {target} does not exist")
        broken += [f"{page.name}: mentions {m}" for m in re.findall(r"\.\./shared/\S+", text)]
    assert broken == []
