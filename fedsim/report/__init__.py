"""``python -m fedsim.report``: compare the runs of a sweep from their ``metrics.jsonl`` and ``summary.json``
files (a table, plots, a grid of settings). It reads files only: no torch, nothing else from fedsim."""
