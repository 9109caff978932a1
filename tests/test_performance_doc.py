"""docs/performance.md stays a page for users: short, every `experiments/` path it names exists, and every section
that another file points to (an anchor link, or a section named in quotes after the file's name) is a heading of it.

mkdocs' strict build checks the anchor links between guides; this also covers the links from experiments' READMEs,
code comments and docstrings, which the site does not build.
"""

from __future__ import annotations

import re
from pathlib import Path

from pymdownx.slugs import slugify

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "performance.md"
MAX_LINES = 300
EXPERIMENTS_PATH = re.compile(r"experiments/[\w./-]*\w")
ANCHOR_LINK = re.compile(r"performance\.md#([\w-]+)")
QUOTED_SECTION = re.compile(r"performance\.md`?,?\s*\(?[\"“]([^\"”\n]+)[\"”]")
FENCE = re.compile(r"^\s*(```|~~~)")
# where other files refer to the page: the guides, the READMEs, code and tests (this file's own patterns excepted)
REFERRING = ["README.md", "CONTRIBUTING.md", "docs/**/*.md", "experiments/**/*.md", "fedsim/**/*.py", "tests/**/*.py"]


def headings(markdown: str) -> list[str]:
    """The page's heading texts (outside code fences), inline code marks removed as the rendered heading has them."""
    found, in_fence = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (m := re.match(r"#{1,6} (.+)", line)):
            found.append(m.group(1).replace("`", "").strip())
    return found


def anchors(markdown: str) -> set[str]:
    """The ids the site gives those headings (mkdocs.yml: pymdownx's slugify, lower case)."""
    slug = slugify(case="lower")
    return {slug(text, "-") for text in headings(markdown)}


def referring_files() -> list[Path]:
    this = Path(__file__).resolve()
    files = {p.resolve() for pattern in REFERRING for p in REPO.glob(pattern)}
    return sorted(p for p in files if p != this and p != PAGE.resolve())


def test_the_page_stays_short() -> None:
    lines = len(PAGE.read_text().splitlines())
    assert lines <= MAX_LINES, f"docs/performance.md has {lines} lines (at most {MAX_LINES}: current figures only)"


def test_every_experiments_path_it_names_exists() -> None:
    named = sorted(set(EXPERIMENTS_PATH.findall(PAGE.read_text())))
    assert named, "docs/performance.md names no experiments/ path (its figures come from scripts there)"
    missing = [path for path in named if not (REPO / path).exists()]
    assert not missing, f"docs/performance.md names paths that do not exist: {missing}"


def test_every_section_other_files_point_to_is_a_heading() -> None:
    page = PAGE.read_text()
    ids, titles = anchors(page), set(headings(page))
    broken = []
    for path in referring_files():
        text = path.read_text()
        where = path.relative_to(REPO)
        broken += [f"{where}: #{a}" for a in ANCHOR_LINK.findall(text) if a not in ids]
        broken += [f'{where}: "{t}"' for t in QUOTED_SECTION.findall(text) if t not in titles]
    assert not broken, f"sections of docs/performance.md that do not exist: {broken}"


def test_the_checks_see_what_they_check() -> None:
    """The patterns find real references, so an empty result above means none is broken, not none was seen."""
    sample = 'see docs/performance.md#the-test-suite and `docs/performance.md`\n("Ray vs process"), '
    assert ANCHOR_LINK.findall(sample) == ["the-test-suite"]
    assert QUOTED_SECTION.findall(sample) == ["Ray vs process"]
    assert "the-servers-own-threads" in anchors("## The server's own threads\n```\n# not a heading\n```\n")
    assert headings("```bash\n# a comment\n```\n## `code` here") == ["code here"]
    assert sum(len(ANCHOR_LINK.findall(p.read_text())) for p in referring_files()) >= 10
