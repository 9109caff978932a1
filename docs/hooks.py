"""MkDocs hooks (mkdocs.yml ``hooks:``): links from a guide to files outside docs/, Sphinx roles in docstrings.

The guides link to ``../experiments/...`` so that they work where the repository is read (a clone, a code host).
The site holds only docs/, so MkDocs would report such a link as "not found" and ``--strict`` would fail, while
silencing that warning would also silence broken links between pages. Instead, this hook checks each such link
against the repository (a missing target is a warning, which ``--strict`` turns into a failure) and shows it on the
site as the repository path in plain text, since the site cannot link to it.

fedsim's docstrings name code with Sphinx roles (``:class:`~fedsim.x.Y```), which Markdown renders as the role's
text before the code; the reference pages show just the code (``Y`` for a ``~`` name, as Sphinx does).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

LOG = logging.getLogger("mkdocs.hooks.outside_links")
LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>\.\./[^)\s#]*)(?P<anchor>#[^)\s]*)?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):<code>(?:~(?:[\w]+\.)*)?")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each link that leaves docs/ by its text and repository path, warning when the target is missing."""
    docs_dir = Path(config["docs_dir"]).resolve()
    repo = docs_dir.parent
    page_dir = (docs_dir / page.file.src_path).parent
    lines = markdown.split("\n")
    in_fence = False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            lines[i] = LINK.sub(lambda m: _as_text(m, page_dir, docs_dir, repo, page.file.src_path), line)
    return "\n".join(lines)


def _as_text(match: re.Match[str], page_dir: Path, docs_dir: Path, repo: Path, page: str) -> str:
    """The link's text, followed by the repository path unless the text already names it."""
    target = (page_dir / match["target"]).resolve()
    if target.is_relative_to(docs_dir):
        return match[0]  # inside docs/: MkDocs checks it
    path = target.relative_to(repo).as_posix() if target.is_relative_to(repo) else match["target"]
    if not target.exists():
        LOG.warning(f"Doc file '{page}' links to '{match['target']}', which is not in the repository ({path}).")
    text = match["text"]
    if path.rstrip("/") in text.strip("`").rstrip("/"):
        return text
    return f"{text} (`{path}`)"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Drop the Sphinx role before each code name that a docstring rendered (``:meth:<code>x</code>``)."""
    return ROLE.sub("<code>", html)
