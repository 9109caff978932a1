"""RunContext: what a strategy is told about the run, once, before the first round (and again on resume)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedsim.params import ParamLayout


@dataclass(frozen=True)
class RunContext:
    """The run as a strategy sees it through :meth:`fedsim.strategy.Strategy.setup`.

    ``layout``: the global model's entries (names, shapes, their slices of the flat vector, which are
    buffers); ``num_examples[i]``: client ``i``'s training examples; ``run_dir``: the run directory, or
    ``None`` when nothing is written to disk; ``start_round``: the first round this process will run
    (greater than 1 after a resume).
    """

    layout: ParamLayout
    num_clients: int
    num_examples: tuple[int, ...]
    clients_per_round: int
    num_rounds: int
    seed: int
    run_dir: Path | None = None
    start_round: int = 1
