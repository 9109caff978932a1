"""Scoring a model on rows of a dataset: the mean loss and accuracy (:func:`evaluate_indices`, the centralized and
local test sets) and every example's own loss (:func:`example_losses`, for every-client evaluation, a root
dataset's or a task's data loss)."""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import nn

from fedsim.data.tensor_data import TensorData


class ScoresExamples(Protocol):
    """What :func:`example_losses` needs of a client: its loss per example
    (:meth:`fedsim.client.Client.per_example_loss`)."""

    def per_example_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...


@torch.no_grad()
def evaluate_indices(
    model: nn.Module, data: TensorData, indices: torch.Tensor | None = None, *, batch_size: int = 256
) -> dict[str, float]:
    """Mean cross-entropy and accuracy over ``data`` (or the given rows of it); ``num_examples`` too. With token
    labels (``data.y`` of shape ``[N, T]``): the mean over the scored tokens (label not -100), token accuracy, and
    ``perplexity`` = exp(token loss) (:func:`_evaluate_tokens`).

    Sums stay on the model's device (float64 loss) until the end: one GPU sync per call, not per batch."""
    if data.y.ndim == 2:
        return _evaluate_tokens(model, data, indices, batch_size=batch_size)
    model.eval()
    device = next(model.parameters()).device
    rows = (torch.arange(len(data)) if indices is None else torch.as_tensor(indices)).to(data.x.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, len(rows), batch_size):
        idx = rows[start : start + batch_size]
        x, y = data.x[idx].to(device), data.y[idx].to(device)
        logits = model(x)
        loss_sum += nn.functional.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(dim=1) == y).sum()
    n = len(rows)
    loss, hits = float(loss_sum), int(correct)
    return {
        "loss": loss / n if n else float("nan"),
        "accuracy": hits / n if n else float("nan"),
        "num_examples": float(n),
    }


def _evaluate_tokens(
    model: nn.Module, data: TensorData, indices: torch.Tensor | None, *, batch_size: int
) -> dict[str, float]:
    """:func:`evaluate_indices` for token labels: sums over the scored tokens, then loss, accuracy and perplexity."""
    model.eval()
    device = next(model.parameters()).device
    rows = (torch.arange(len(data)) if indices is None else torch.as_tensor(indices)).to(data.x.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    tokens = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, len(rows), batch_size):
        idx = rows[start : start + batch_size]
        x, y = data.x[idx].to(device), data.y[idx].to(device)
        logits = model(x).transpose(1, 2)
        loss_sum += nn.functional.cross_entropy(logits, y, reduction="sum").double()
        scored = y != -100
        correct += ((logits.argmax(dim=1) == y) & scored).sum()
        tokens += scored.sum()
    n, loss = int(tokens), float(loss_sum)
    mean = loss / n if n else float("nan")
    return {
        "loss": mean,
        "accuracy": int(correct) / n if n else float("nan"),
        "perplexity": math.exp(mean) if n else float("nan"),
        "num_examples": float(len(rows)),
        "num_tokens": float(n),
    }


@torch.no_grad()
def example_losses(
    client: ScoresExamples, model: nn.Module, data: TensorData, indices: torch.Tensor, *, batch_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every listed example's loss (``client.per_example_loss``) and whether ``model`` classified it right, as two
    CPU tensors in the order of ``indices``; the model is put in evaluation mode. Batches of ``batch_size`` rows
    in that order: the same rows give the same values, bit for bit, wherever this runs with the same threads.
    With token labels, "classified right" is each example's share of correctly predicted scored tokens (float)."""
    model.eval()
    device = next(model.parameters()).device
    rows = torch.as_tensor(indices).to(data.x.device)
    losses, correct = [], []
    for start in range(0, len(rows), batch_size):
        idx = rows[start : start + batch_size]
        x, y = data.x[idx].to(device), data.y[idx].to(device)
        logits = model(x)
        losses.append(client.per_example_loss(logits, y).float().cpu())
        correct.append(_hits(logits, y).cpu())
    if not losses:
        return torch.zeros(0), torch.zeros(0, dtype=torch.bool)
    return torch.cat(losses), torch.cat(correct)


def _hits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Whether each example is classified right; with token labels, its share of right scored tokens."""
    if y.ndim == 1:
        return logits.argmax(dim=1) == y
    scored = y != -100
    right = ((logits.argmax(dim=-1) == y) & scored).sum(dim=1)
    return right / scored.sum(dim=1).clamp(min=1)
