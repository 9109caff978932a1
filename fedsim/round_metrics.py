"""What one round reports about its clients: a row per client update and the round's training scalars."""

from __future__ import annotations

import math
from typing import Any

import torch

from fedsim.types import ClientUpdate


def client_row(update: ClientUpdate, global_params: torch.Tensor) -> dict[str, Any]:
    """One client's line of the round's ``clients`` record (``metrics.jsonl``); ``update_norm`` is the L2
    distance of its weights from the global weights it started from."""
    return {
        "client_id": update.client_id,
        "num_examples": update.num_examples,
        "train_loss": update.metrics.get("train_loss"),
        "update_norm": float(torch.linalg.vector_norm(update.params - global_params)),
        "epoch_losses": list(update.epoch_losses),
        "worker": update.worker,
        "device": update.device,
    }


def train_metrics(updates: list[ClientUpdate], num_sampled: int) -> dict[str, float]:
    """Example-weighted mean training loss and client counts of one round."""
    examples = sum(u.num_examples for u in updates)
    loss = sum(u.metrics.get("train_loss", 0.0) * u.num_examples for u in updates) / examples if examples else math.nan
    return {
        "train/loss": loss,
        "client/num_sampled": float(num_sampled),
        "client/num_failed": float(num_sampled - len(updates)),  # raised, died, timed out or rejected
        "client/num_examples": float(examples),
    }
