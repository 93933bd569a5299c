"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing page
or API reference, or a generated part that names a command or record that is not there fails
the suite. And the README, the front page, stays short and links only to what exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    commands = (tmp_path / "site" / "commands" / "index.html").read_text()
    assert "--dry-run" in commands and "--prune" in commands  # the generated options are there
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    assert "bench/cpu/parallel.txt" in benchmarks  # and so are the committed records


def test_the_readme_is_a_front_page_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "```\nmake train\nmake test\n```" in text  # the quickstart is exactly the two commands
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links, "the README links to the docs"
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert missing == []
