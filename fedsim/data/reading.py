"""What the dataset readers share (:mod:`fedsim.data.vision`, :mod:`~fedsim.data.leaf`, :mod:`~fedsim.data.hf`,
:mod:`~fedsim.data.instructions`, :mod:`~fedsim.data.text_corpus`, :mod:`~fedsim.data.synthetic` and the others):
the one-line messages their refusals are made of.

A reader turns every problem with its input into one line that names the file (and the line, the user or the key)
and says what to do; these helpers are the parts of those lines that more than one reader writes. The pooled layout
of a dataset with its own per-owner split is :func:`fedsim.data.tensor_data.pooled_split`.
"""

from __future__ import annotations


def one_line(text: object, limit: int = 300) -> str:
    """``text`` (a message, often another library's exception) with its lines joined by spaces and cut to ``limit``
    characters, to quote inside a reader's own one-line message."""
    joined = " ".join(line.strip() for line in str(text).splitlines() if line.strip())
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."
