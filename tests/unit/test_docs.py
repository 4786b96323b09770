"""The user docs: every relative link resolves, and the README points to every page of docs/."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def test_relative_links_resolve() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, man: ...
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to missing {target}"


def test_readme_points_to_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f"docs/{page.name}" in readme, f"README does not link docs/{page.name}"
