"""A round's traffic: the broadcast, the executor's tasks, each update as the server decodes it, and the byte ledger.

Bytes are those of the encodings (:meth:`fedsim.comm.pipeline.Chain.nbytes`): each task downloads the broadcast
once, plus the arrays of its config (a strategy's messages such as SCAFFOLD's control variate, raw:
:mod:`fedsim.comm.messages`), and each client that returns an update uploads one (a failed task uploads nothing; an
update the server then rejects was still sent). Totals are cumulative over the run and kept in checkpoints, so a
resumed run continues them.
A strategy's personal entries (:meth:`fedsim.strategy.Strategy.personal_entries`: FedPer's personal layers,
FedSA-LoRA's B) never travel up: a client uploads the other entries only (an attack replaces, the codecs and error
feedback encode, and the ledger counts those alone), and the server rebuilds a full update whose personal entries
are the global weights' (:meth:`Exchange.keep_on_clients`).
Metrics: ``comm/bytes_down`` and ``comm/bytes_up`` (the round's), ``comm/bytes_down_total``, ``comm/bytes_up_total``
and ``comm/mb_total`` (both ways, 10^6 bytes, the x-axis of ``fedsim.report --x comm_mb``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from fedsim.comm.messages import message_nbytes
from fedsim.comm.pipeline import Compression
from fedsim.core.seeding import comm_seed
from fedsim.core.types import ClientUpdate, FitTask, TaskResult
from fedsim.core.update_checks import rejection_reason
from fedsim.executor.base import Executor

Poison = Callable[[Sequence[TaskResult], torch.Tensor], list[TaskResult]]
RESIDUAL = "fedsim.comm.residual"  # the client-state key of the error-feedback residual (never sent to the worker)
_DOWN, _UP = 0, 1


def task_state(state: dict[str, Any]) -> dict[str, Any]:
    """The part of a client's state its task needs: all but the residual, which only the encoder reads."""
    return {k: v for k, v in state.items() if k != RESIDUAL} if RESIDUAL in state else state


class Exchange:
    """Encodes each direction with ``compression`` and counts the bytes of a run with ``num_params`` weights."""

    def __init__(self, compression: Compression, num_params: int, seed: int) -> None:
        self.compression, self.seed, self.num_params = compression, seed, num_params
        self.down_bytes = compression.downlink.nbytes(num_params)
        self.up_bytes = compression.uplink.nbytes(num_params)
        self.total_down, self.total_up = 0, 0
        self.personal: torch.Tensor | None = None  # entries that stay on the clients (keep_on_clients)
        self.shared: torch.Tensor | None = None  # its complement: what a client uploads

    def keep_on_clients(self, personal: torch.Tensor | None) -> None:
        """From now on clients upload every entry but ``personal`` (a boolean mask over the flat vector; ``None``:
        every entry goes up), and an upload counts the bytes of those entries alone."""
        if personal is self.personal:
            return
        if personal is not None and (personal.dtype != torch.bool or personal.shape != (self.num_params,)):
            raise ValueError(
                f"personal_entries() must be a boolean mask of the {self.num_params} federated entries "
                f"(got {personal.dtype} of shape {tuple(personal.shape)})"
            )
        self.personal, self.shared = personal, (~personal if personal is not None else None)
        uploaded = self.num_params if personal is None else self.num_params - int(personal.sum())
        self.up_bytes = self.compression.uplink.nbytes(uploaded)

    def upload(self, result: TaskResult, base: torch.Tensor) -> TaskResult:
        """``result`` as the server rebuilds it from what its client uploaded: the personal entries are ``base``'s
        (the weights the server holds for them), the others the client's. Failures, updates without personal
        entries to cut and updates the checks will reject for their shape or dtype pass unchanged."""
        if (
            self.shared is None
            or not isinstance(result, ClientUpdate)
            or result.params.shape != base.shape
            or result.params.dtype != base.dtype
        ):
            return result
        return replace(result, params=torch.where(self.shared, result.params, base))

    def fit(
        self,
        executor: Executor,
        global_params: torch.Tensor,
        tasks: Sequence[FitTask],
        states: Mapping[int, dict[str, Any]],
        poison: Poison | None = None,
    ) -> list[TaskResult]:
        """Broadcast ``global_params``, run ``tasks`` and decode their updates (sorted by client id); ``states``: the
        clients' full states as stored (the tasks carry :func:`task_state` of them). ``poison(results, received)``:
        the malicious clients' replacements, applied before encoding, as a client would (:mod:`fedsim.attacks`)."""
        if not tasks:
            return []
        received = self.broadcast(global_params, tasks[0].round_num)
        results = sorted(executor.fit(received, tasks), key=lambda r: r.client_id)
        results = [self.upload(r, received) for r in results]  # what an attack sees: Δ is 0 on personal entries
        if poison is not None:
            results = poison(results, received)
        return [self.receive(r, received, global_params, states.get(r.client_id, {})) for r in results]

    def broadcast(self, params: torch.Tensor, round_num: int) -> torch.Tensor:
        """The weights every client of round ``round_num`` receives."""
        if self.compression.downlink.lossless:
            return params
        generator = torch.Generator().manual_seed(comm_seed(self.seed, round_num, _DOWN, 0))
        return self.compression.downlink.apply(params, generator)

    def receive(
        self, result: TaskResult, received: torch.Tensor, global_params: torch.Tensor, state: dict[str, Any]
    ) -> TaskResult:
        """The update as the server decodes it: ``global_params`` + the decoded Δ (trained − ``received``), with the
        new residual in its state under error feedback; only the entries a client uploads are encoded (Δ is 0 on the
        personal ones, :meth:`upload`). Failures, and updates the server's checks will reject (wrong shape,
        non-finite...), pass unchanged."""
        result = self.upload(result, received)  # what an attack wrote into personal entries was never sent either
        if not isinstance(result, ClientUpdate) or rejection_reason(result, received) is not None:
            return result
        if self.compression.lossless:  # then ``received`` is ``global_params`` (a lossless broadcast)
            return result
        delta = result.params - received
        residual = state.get(RESIDUAL) if self.compression.error_feedback else None
        if residual is not None:
            delta = delta + residual
        generator = torch.Generator().manual_seed(comm_seed(self.seed, result.round_num, _UP, result.client_id))
        decoded = self.encode_up(delta, generator)
        update = replace(result, params=global_params + decoded)
        if self.compression.error_feedback:
            kept = result.state if result.state is not None else task_state(state)
            update = replace(update, state={**kept, RESIDUAL: delta - decoded})
        return update

    def encode_up(self, delta: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """What the server decodes of ``delta``: the uplink chain applied to the uploaded entries alone (so a top-k
        picks among them and a quantiser scales by their norm), 0 on the personal ones."""
        if self.shared is None:
            return self.compression.uplink.apply(delta, generator)
        decoded = torch.zeros_like(delta)
        decoded[self.shared] = self.compression.uplink.apply(delta[self.shared], generator)
        return decoded

    def task_down_bytes(self, config: Mapping[str, Any]) -> int:
        """What one task downloads: the encoded model and its config's arrays."""
        return self.down_bytes + message_nbytes(config)

    def round_metrics(self, down: int, results: Sequence[TaskResult]) -> dict[str, float]:
        """The round's ``comm/`` metrics (``down``: the bytes the round's clients downloaded, see
        :meth:`task_down_bytes`); adds them to the run's totals."""
        uploads = sum(isinstance(r, ClientUpdate) for r in results)
        up = uploads * self.up_bytes
        self.total_down += down
        self.total_up += up
        return {
            "comm/bytes_down": float(down),
            "comm/bytes_up": float(up),
            "comm/bytes_down_total": float(self.total_down),
            "comm/bytes_up_total": float(self.total_up),
            "comm/mb_total": (self.total_down + self.total_up) / 1e6,
        }

    def state_dict(self) -> dict[str, int]:
        return {"bytes_down_total": self.total_down, "bytes_up_total": self.total_up}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.total_down, self.total_up = int(state["bytes_down_total"]), int(state["bytes_up_total"])
