"""RunContext: what a strategy is told about the run, once, before the first round (and again on resume)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedsim.core.checks import integer
from fedsim.core.params import ParamLayout

if TYPE_CHECKING:
    from fedsim.strategy.root_data import RootTrainer


@dataclass(frozen=True)
class RunContext:
    """The run as a strategy sees it through :meth:`fedsim.strategy.Strategy.setup`.

    ``layout``: the global model's entries (names, shapes, their slices of the flat vector, which are
    buffers); ``num_examples[i]``: client ``i``'s training examples; ``run_dir``: the run directory, or
    ``None`` when nothing is written to disk; ``start_round``: the first round this process will run
    (greater than 1 after a resume); ``root_trainer(size)``: a :class:`~fedsim.strategy.root_data.RootTrainer`
    over ``size`` clean training examples the server holds (a root dataset, as FLTrust assumes;
    :mod:`fedsim.strategy.root_data`), or ``None`` where the server offers none (a context built by hand).
    """

    layout: ParamLayout
    num_clients: int
    num_examples: tuple[int, ...]
    clients_per_round: int
    num_rounds: int
    seed: int
    run_dir: Path | None = None
    start_round: int = 1
    root_trainer: Callable[[int], RootTrainer] | None = None

    def root(self, size: int, option: str) -> RootTrainer:
        """``root_trainer(size)``, or a one-line ``ValueError`` saying that ``strategy=<option>`` needs a root dataset
        where this context offers none."""
        if self.root_trainer is None:
            raise ValueError(f"strategy={option} needs the server's root dataset; this run context offers none")
        return self.root_trainer(size)


def root_size_setting(value: object) -> int:
    """``strategy.root_size`` checked: an integer >= 1, else a one-line ``ValueError`` naming it."""
    return integer("strategy.root_size", value, 1)
