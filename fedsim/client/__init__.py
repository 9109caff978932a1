"""One client and what runs inside a task: :class:`Client` (local data, the local training loop, evaluation),
the contract of a strategy's client half (:class:`~fedsim.client.local_training.LocalTraining`, which the
client calls and a strategy implements), the :class:`~fedsim.client.task_trainer.TaskTrainer` it hands to
that half, the clients' state store kept across rounds, every-client evaluation cohorts, adapters for a
researcher's own model objects, and the federation: a dataset partitioned into clients. Nothing here knows
strategies, executors or the server."""

from fedsim.client.base import Client, OptimizerFactory, default_optimizer
from fedsim.client.schedule import LrSchedule
from fedsim.client.scoring import evaluate_indices, example_losses

__all__ = ["Client", "LrSchedule", "OptimizerFactory", "default_optimizer", "evaluate_indices", "example_losses"]
