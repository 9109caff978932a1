"""Secure aggregation as one round stage, built on the server's public round API alone (:mod:`fedsim.server.stage`,
:mod:`fedsim.server.record`): :class:`SecureAggregation`, named ``secagg`` and placed ``after receive``.

What it does each round, on the server (docs/secure-aggregation.md):

* the **client side**, simulated from each client's update as the server decoded it: clip, rotate, scale, round
  stochastically, reduce mod 2^b (:mod:`fedsim.secagg.quantize`), all pure functions of (seed, round, client), so it
  does not matter who computes them (the executor's workers give the same updates bit for bit);
* **dropouts**: a client of the round's cohort whose update did not reach this stage (failed, rejected, dropped by the
  simulated clock or as a straggler) dropped out after the key phases; of the others, each drops out with probability
  ``dropout``, drawn from (seed, round, client);
* the **protocol** (:mod:`fedsim.secagg.protocol`) on the survivors' integers, with real masks and real Shamir
  shares, SecAgg's complete graph or SecAgg+'s random k-regular one; too few survivors fail the round;
* the **decoded mean update** becomes the one aggregate input of the strategy (``record.aggregate_input``), each
  client weighing 1 (the mean of the clipped updates, not FedAvg's example-weighted one; see the docs), and
  ``record.kept`` the survivors' updates (their states are committed, the dropped clients' are not);
* its ``secagg/`` metrics, and the ``comm/`` bytes of the round as secure aggregation moves them.

It declares ``needs = {"updates"}`` and ``preserves = {"clock"}``: after it no stage and no strategy may read the
individual updates, so Krum, the median or FLTrust are refused in one line before any work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

import numpy as np
import torch

from fedsim.core.errors import RoundFailedError
from fedsim.core.types import ClientUpdate
from fedsim.secagg.costs import cost_metrics, round_bytes
from fedsim.secagg.masking import complete_graph, default_degree, harary_graph
from fedsim.secagg.protocol import RoundSetup, secure_sum, threshold_of
from fedsim.secagg.quantize import (
    Quantizer,
    default_levels,
    padded_size,
    rotation_signs,
    rounding_generator,
    to_group,
)
from fedsim.secagg.seeds import DROPOUT, uniform
from fedsim.server.record import RoundRecord
from fedsim.server.stage import CLOCK, UPDATES, RoundStage

PROTOCOLS = ("secagg", "secagg_plus")


def _check(name: str, ok: bool, rule: str, value: object, hint: str = "") -> None:
    """Refuse, in one line naming ``secagg.<name>``, a value for which ``ok`` is false."""
    if not ok:
        raise ValueError(f"secagg.{name} must be {rule} (got {value!r}){'; ' + hint if hint else ''}")


def _number(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value))


class SecureAggregation(RoundStage):
    """SecAgg (``protocol="secagg"``, Bonawitz et al., CCS 2017) or SecAgg+ (``"secagg_plus"``, Bell et al., CCS
    2020) with ``bits`` b per coordinate (8 to 32), updates clipped to L2 norm ``clip``, scaled by ``scale`` (``None``:
    the largest with which the sum cannot wrap around), rotated when ``rotation``; a secret is recovered from
    ``threshold`` (a fraction) of its holders; ``dropout``: each client's chance to drop out after the key phases;
    ``degree``: SecAgg+'s k (``None``: of order log n). ``seed``: the run's seed (every draw comes from it);
    ``clients_per_round``: when given, a default scale that cannot fit that cohort is refused at once."""

    name, position = "secagg", "after receive"
    needs, preserves = frozenset({UPDATES}), frozenset({CLOCK})

    def __init__(
        self,
        *,
        seed: int = 0,
        protocol: str = "secagg",
        bits: int = 16,
        clip: float = 1.0,
        scale: float | None = None,
        threshold: float = 0.5,
        dropout: float = 0.0,
        rotation: bool = True,
        degree: int | None = None,
        clients_per_round: int | None = None,
    ) -> None:
        _check("protocol", protocol in PROTOCOLS, f"one of {', '.join(PROTOCOLS)}", protocol)
        _check("bits", isinstance(bits, int) and not isinstance(bits, bool) and 8 <= bits <= 32, "in [8, 32]", bits)
        _check("clip", _number(clip) and clip > 0, "a finite number > 0", clip, "the L2 bound on each update")
        _check("scale", scale is None or (_number(scale) and scale > 0), "> 0 or null (derived)", scale)
        _check("threshold", _number(threshold) and 0 < threshold <= 1, "in (0, 1]", threshold)
        _check("dropout", _number(dropout) and 0 <= dropout < 1, "in [0, 1)", dropout)
        _check("rotation", isinstance(rotation, bool), "true or false", rotation)
        even = isinstance(degree, int) and not isinstance(degree, bool) and degree >= 2 and degree % 2 == 0
        _check("degree", degree is None or even, "an even integer >= 2 or null (of order log n)", degree)
        _check("degree", degree is None or protocol == "secagg_plus", "null with secagg=secagg", degree, "SecAgg+ only")
        self.seed, self.protocol, self.bits, self.clip, self.scale = int(seed), protocol, bits, float(clip), scale
        self.threshold, self.dropout, self.rotation, self.degree = float(threshold), float(dropout), rotation, degree
        self.label = f"secagg={protocol}: only the sum reaches the server"
        self.up_offset, self.down_offset = 0, 0  # what secure aggregation changed in the comm/ totals so far
        if clients_per_round is not None and scale is None and default_levels(bits, clients_per_round) < 1:
            raise ValueError(
                f"secagg.bits={bits} cannot hold the sum of clients_per_round={clients_per_round} clients without "
                f"wrap-around (the default scale needs n < 2^(b-1) = {2 ** (bits - 1)}); raise secagg.bits, or set "
                "secagg.scale to study wrap-around"
            )

    def client_noise(self, round_num: int, client_id: int, size: int) -> torch.Tensor | None:
        """Integer noise ``client_id`` adds to its quantized update before masking (int64, ``size`` coordinates), or
        ``None`` (none: this increment). The place of distributed DP: a subclass draws discrete Gaussian or Skellam
        noise from (seed, round, client) here and reserves room for it in :meth:`noise_headroom`."""
        return None

    def noise_headroom(self, cohort: int) -> int:
        """A bound on |Σ noise| per coordinate for ``cohort`` clients, which the default scale keeps free so that
        the sum does not wrap around (0: no noise)."""
        return 0

    def drops(self, round_num: int, client_id: int) -> bool:
        """Whether ``client_id`` drops out after the key phases of round ``round_num`` (``dropout``'s draw)."""
        return self.dropout > 0 and uniform(self.seed, DROPOUT, round_num, client_id) < self.dropout

    def graph(self, cohort: list[int], round_num: int) -> dict[int, tuple[int, ...]]:
        """The round's communication graph: complete (SecAgg) or SecAgg+'s Harary graph of degree k."""
        if self.protocol == "secagg":
            return complete_graph(cohort)
        k = self.degree if self.degree is not None else default_degree(len(cohort))
        return harary_graph(cohort, k, self.seed, round_num)

    def quantizer(self, round_num: int, cohort: int, size: int) -> Quantizer:
        """The round's :class:`~fedsim.secagg.quantize.Quantizer` for a cohort of ``cohort`` and ``size``-coordinate
        updates (the default scale is derived from b, the cohort and the clip: no wrap-around)."""
        signs = rotation_signs(self.seed, round_num, padded_size(size, True)) if self.rotation else None
        if self.scale is not None:
            return Quantizer(self.bits, self.clip, float(self.scale), float(self.scale) * self.clip, signs)
        levels = default_levels(self.bits, cohort, self.noise_headroom(cohort))
        if levels < 1:
            raise RoundFailedError(
                f"round {round_num}: secagg.bits={self.bits} cannot hold the sum of this round's {cohort} clients "
                f"without wrap-around (n must stay below 2^(b-1)); raise secagg.bits or set secagg.scale"
            )
        return Quantizer(self.bits, self.clip, levels / self.clip, float(levels), signs)

    def run(self, record: RoundRecord) -> dict[str, float]:
        round_num, start = record.round_num, record.params.double()
        cohort = sorted(record.schedule.sampled) if record.schedule is not None else record.client_ids
        arrived = {u.client_id: u for u in record.kept}
        strangers = sorted(set(arrived) - set(cohort))
        if strangers:
            raise ValueError(f"round {round_num}: secagg: updates of clients {strangers} outside the round's cohort")
        survivors = [c for c in sorted(arrived) if not self.drops(round_num, c)]
        if not cohort:  # nobody started the round (the clock found no client online): nothing to aggregate
            record.aggregate_input, record.kept = [], []
            return {"cohort": 0.0}
        setup = RoundSetup(
            self.seed, round_num, self.bits, self.graph(cohort, round_num), self.threshold, self.protocol
        )
        setup.check(survivors)  # before any work: too few survivors fail the round
        quantizer = self.quantizer(round_num, len(cohort), start.numel())
        inputs, exact, metrics = self._client_side(round_num, quantizer, start, [arrived[c] for c in survivors])
        total = secure_sum(setup, {c: x.numpy() for c, x in inputs.items()})
        mean = quantizer.decode(torch.from_numpy(total.astype(np.int64)), len(survivors), start.numel())
        update = ClientUpdate(-1, round_num, (start + mean).to(record.params.dtype), num_examples=1)
        record.aggregate_input, record.kept = [update], [arrived[c] for c in survivors]
        for cid in arrived:
            record.add_to_rows(cid, secagg_dropped=cid not in inputs)
        metrics |= self._round_metrics(setup, survivors, quantizer, (mean - exact).abs().max(), start.numel())
        coordinates = quantizer.coordinates(start.numel())
        return metrics | self._bytes(record, round_bytes(setup.neighbours, survivors, coordinates, self.bits))

    def _round_metrics(
        self, setup: RoundSetup, survivors: list[int], quantizer: Quantizer, error: torch.Tensor, size: int
    ) -> dict[str, float]:
        """Who took part, the graph and threshold, and the quantization's scale, largest error and bound."""
        degree = max(len(n) for n in setup.neighbours.values())
        return {
            "cohort": float(len(setup.cohort)),
            "survivors": float(len(survivors)),
            "dropped": float(len(setup.cohort) - len(survivors)),
            "degree": float(degree),
            "threshold": float(threshold_of(self.threshold, degree + 1)),
            "bits": float(self.bits),
            "scale": quantizer.scale,
            "error_max": float(error),
            "error_bound": quantizer.error_bound(size),
        }

    def _client_side(
        self, round_num: int, quantizer: Quantizer, start: torch.Tensor, updates: list[ClientUpdate]
    ) -> tuple[dict[int, torch.Tensor], torch.Tensor, dict[str, float]]:
        """Each survivor's input in [0, 2^b) (by client id), the exact mean of their clipped updates (what the
        decoding approximates) and the ``clipped`` and ``wrapped`` counts (the latter from the true integer sum,
        which only the simulator knows)."""
        inputs, clipped_total, clipped = {}, torch.zeros_like(start), 0
        true_sum = torch.zeros(quantizer.coordinates(start.numel()), dtype=torch.int64)
        for update in updates:
            delta, bound = quantizer.clip_update(update.params.double() - start)
            q = quantizer.quantize(delta, rounding_generator(self.seed, round_num, update.client_id))
            noise = self.client_noise(round_num, update.client_id, q.numel())
            q = q if noise is None else q + noise
            inputs[update.client_id] = to_group(q, self.bits)
            true_sum, clipped_total, clipped = true_sum + q, clipped_total + delta, clipped + bound
        half = 2 ** (self.bits - 1)
        wrapped = int(((true_sum < -half) | (true_sum >= half)).sum())
        exact = clipped_total / max(1, len(updates))
        return inputs, exact, {"clipped": float(clipped), "wrapped": float(wrapped)}

    def _bytes(self, record: RoundRecord, per_client: Mapping[int, Mapping[str, tuple[int, int]]]) -> dict[str, float]:
        """The round's ``secagg/`` byte metrics; each client row's bytes and the round's ``comm/`` metrics as secure
        aggregation moves them: the uplink is what the clients send in its phases (the masked input in place of the
        update), the downlink gains what they receive (the offsets to the exchange's totals are this stage's state)."""
        metrics = cost_metrics(per_client)
        for cid, phases in per_client.items():
            down = record.client_extras.get(cid, {}).get("bytes_down", 0)
            sent, received = sum(p[0] for p in phases.values()), sum(p[1] for p in phases.values())
            record.add_to_rows(cid, bytes_up=sent, bytes_down=down + received)
        comm = record.metrics
        if "comm/bytes_up" in comm:
            self.up_offset += int(metrics["bytes_up"] - comm["comm/bytes_up"])
            self.down_offset += int(metrics["bytes_down"])
            comm["comm/bytes_up"], comm["comm/bytes_down"] = (
                metrics["bytes_up"],
                comm["comm/bytes_down"] + metrics["bytes_down"],
            )
            comm["comm/bytes_up_total"] += self.up_offset
            comm["comm/bytes_down_total"] += self.down_offset
            comm["comm/mb_total"] = (comm["comm/bytes_up_total"] + comm["comm/bytes_down_total"]) / 1e6
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The offsets this stage added to the exchange's ``comm/`` totals so far."""
        return {"bytes_up_offset": self.up_offset, "bytes_down_offset": self.down_offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the offsets back (a resume)."""
        self.up_offset, self.down_offset = int(state["bytes_up_offset"]), int(state["bytes_down_offset"])
