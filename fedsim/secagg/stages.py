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
* with **distributed DP** (``dp``, :mod:`fedsim.secagg.ddp`): each client's conditionally rounded integers get its
  discrete Gaussian or Skellam noise before the reduction mod 2^b; the ledger adds the round's privacy and may stop
  the run before its budget is exceeded (``record.stop_reason``);
* its ``secagg/`` metrics, and the ``comm/`` bytes of the round as secure aggregation moves them;
* on the **simulated clock** (``clock``): the protocol's phases, their bytes and compute, make the round's simulated
  duration (:mod:`fedsim.secagg.timing`; ``record.schedule`` is replaced before the clock stage moves the clock).

It declares ``needs = {"updates"}`` and ``preserves = {"clock"}``: after it no stage and no strategy may read the
individual updates, so Krum, the median or FLTrust are refused in one line before any work.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedsim.core.errors import RoundFailedError
from fedsim.core.types import ClientUpdate
from fedsim.secagg.costs import CommLedger, round_bytes
from fedsim.secagg.ddp import DistributedDP, RoundNoise
from fedsim.secagg.masking import complete_graph, default_degree, harary_graph
from fedsim.secagg.protocol import RoundSetup, secure_sum, threshold_of
from fedsim.secagg.quantize import (
    Quantizer,
    default_levels,
    padded_size,
    rotation_signs,
    rounding_generator,
    sigma_levels,
    to_group,
)
from fedsim.secagg.seeds import DROPOUT, uniform
from fedsim.secagg.settings import check_settings
from fedsim.secagg.timing import on_the_clock
from fedsim.server.record import RoundRecord
from fedsim.server.stage import CLOCK, UPDATES, RoundStage
from fedsim.sim.clock import SyncClock


class SecureAggregation(RoundStage):
    """SecAgg (``protocol="secagg"``, Bonawitz et al., CCS 2017) or SecAgg+ (``"secagg_plus"``, Bell et al., CCS
    2020) with ``bits`` b per coordinate (8 to 32), updates clipped to L2 norm ``clip``, scaled by ``scale`` (``None``:
    the largest with which the sum cannot wrap around; with ``scale_sigmas`` k, the papers' scale, with which k
    standard deviations of a coordinate of the sum fit), rotated when ``rotation``; a secret is recovered from
    ``threshold`` (a fraction) of its holders; ``dropout``: each client's chance to drop out after the key phases;
    ``degree``: SecAgg+'s k (``None``: of order log n). ``seed``: the run's seed (every draw comes from it);
    ``clients_per_round``: K, the clients a round plans to aggregate (a default scale that cannot fit them is refused
    at once; distributed DP calibrates its noise to them). ``dp``: distributed DP (:class:`DistributedDP`; its
    target ε is for ``num_rounds`` rounds). ``clock``: the run's simulated clock, to time the protocol's phases."""

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
        scale_sigmas: float | None = None,
        clients_per_round: int | None = None,
        dp: DistributedDP | None = None,
        num_rounds: int | None = None,
        clock: SyncClock | None = None,
    ) -> None:
        check_settings(
            protocol=protocol, bits=bits, clip=clip, scale=scale, threshold=threshold, dropout=dropout,
            rotation=rotation, degree=degree, scale_sigmas=scale_sigmas, dp=dp,
        )  # fmt: skip
        self.seed, self.protocol, self.bits, self.clip, self.scale = int(seed), protocol, bits, float(clip), scale
        self.threshold, self.dropout, self.rotation, self.degree = float(threshold), float(dropout), rotation, degree
        self.scale_sigmas = None if scale_sigmas is None else float(scale_sigmas)
        self.dp, self.planned, self.num_rounds, self.clock = dp or DistributedDP(), clients_per_round, num_rounds, clock
        if self.dp.target is not None and num_rounds is None:
            raise ValueError("secagg.dp.epsilon is a target for the whole run: give the stage num_rounds")
        self.label = f"secagg={protocol}: only the sum reaches the server"
        self.comm = CommLedger()
        self.round_noise: RoundNoise | None = None  # this round's, while it runs
        self.prepared = False  # distributed DP's z solved and its budget checked (prepare)
        if (
            clients_per_round is not None
            and scale is None
            and scale_sigmas is None
            and self._levels(clients_per_round, 1) < 1
        ):
            raise ValueError(
                f"secagg.bits={bits} cannot hold the sum of clients_per_round={clients_per_round} clients without "
                f"wrap-around (the default scale needs n < 2^(b-1) = {2 ** (bits - 1)}, less the noise's room); raise "
                "secagg.bits, or set secagg.scale to study wrap-around"
            )

    def client_noise(self, round_num: int, client_id: int, size: int) -> torch.Tensor | None:
        """Integer noise ``client_id`` adds to its quantized update before masking (int64, ``size`` coordinates), or
        ``None``: distributed DP's discrete Gaussian or Skellam noise from the client's own stream. A subclass may
        add noise of its own here, and reserve room for it in :meth:`noise_headroom`."""
        noise = self.round_noise
        return None if noise is None else noise.sample(self.seed, round_num, client_id)

    def noise_headroom(self, cohort: int) -> int:
        """A bound on |Σ noise| per coordinate for ``cohort`` clients, which the default scale keeps free so that
        the sum does not wrap around (0: no noise of a subclass; distributed DP keeps its room in :meth:`_levels`)."""
        return 0

    def _levels(self, cohort: int, dim: int, planned: int | None = None, z: float | None = None) -> int:
        """The default scale's ℓ for a cohort of n, d' = ``dim``, K = ``planned`` (by default the stage's, or n)
        and noise multiplier ``z`` (by default distributed DP's; before it is solved, and without DP, 0)."""
        planned = planned or self.planned or cohort
        z = 0.0 if not self.dp.on else (self.dp.z or 0.0) if z is None else z
        if self.scale_sigmas is not None:
            return sigma_levels(self.bits, cohort, dim, self.scale_sigmas, z * z * cohort / planned)
        if not self.dp.on:
            return default_levels(self.bits, cohort, self.noise_headroom(cohort))
        return self.dp.levels(self.bits, cohort, planned, z)

    def prepare(self, size: int, planned: int | None = None) -> None:
        """Once the model's ``size`` is known: distributed DP's noise multiplier solved from its target ε, and an
        ``epsilon_max`` that a single round exceeds refused (one line). The command line calls it before the first
        round; otherwise the first round does."""
        if not self.dp.on:
            self.prepared = True
            return
        planned = planned or self.planned
        assert planned is not None  # the first round passes its cohort when the stage was not told
        dim = padded_size(size, self.rotation)
        fixed = self.scale * self.clip if self.scale is not None else None
        z = self.dp.solve(lambda z: fixed or self._levels(planned, dim, planned, z), dim, planned, self.num_rounds or 1)
        self.dp.check_first(self.dp.noise(z, fixed or self._levels(planned, dim, planned), dim, planned), planned)
        self.prepared = True

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
        updates (the default scale is derived from b, the cohort, the clip and the noise: no wrap-around)."""
        signs = rotation_signs(self.seed, round_num, padded_size(size, True)) if self.rotation else None
        if self.scale is not None:
            return Quantizer(self.bits, self.clip, float(self.scale), float(self.scale) * self.clip, signs)
        levels = self._levels(cohort, padded_size(size, self.rotation))
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
        quantizer = self._round_quantizer(round_num, len(cohort), start.numel())
        inputs, exact, noise, metrics = self._client_side(round_num, quantizer, start, [arrived[c] for c in survivors])
        total = torch.from_numpy(secure_sum(setup, {c: x.numpy() for c, x in inputs.items()}).astype(np.int64))
        mean = quantizer.decode(total, len(survivors), start.numel())
        update = ClientUpdate(-1, round_num, (start + mean).to(record.params.dtype), num_examples=1)
        record.aggregate_input, record.kept = [update], [arrived[c] for c in survivors]
        for cid in arrived:
            record.add_to_rows(cid, secagg_dropped=cid not in inputs)
        error = (quantizer.decode(total - noise, len(survivors), start.numel()) - exact).abs().max()
        metrics |= self._round_metrics(setup, survivors, quantizer, error, start.numel())
        metrics |= self._privacy(record, len(inputs), len(cohort))
        coordinates = quantizer.coordinates(start.numel())
        per_client = round_bytes(setup.neighbours, survivors, coordinates, self.bits)
        metrics |= self.comm.apply(record, per_client)
        if self.clock is not None and record.schedule is not None:
            metrics |= on_the_clock(record, setup, survivors, per_client, coordinates, self.clock.profiles)
        return metrics

    def _round_quantizer(self, round_num: int, cohort: int, size: int) -> Quantizer:
        """The round's quantizer and, with distributed DP, its noise (:attr:`round_noise`); a noise multiplier
        that cannot be solved, or a budget one round exceeds, fails the round in one line before any release."""
        if self.dp.on and not self.prepared:
            try:
                self.prepare(size, self.planned or cohort)
            except ValueError as error:
                raise RoundFailedError(f"round {round_num}: {error}") from None
        quantizer = self.quantizer(round_num, cohort, size)
        self.round_noise = None
        if self.dp.on:
            assert self.dp.z is not None  # prepare solved it
            dim = quantizer.coordinates(size)
            self.round_noise = self.dp.noise(self.dp.z, quantizer.levels, dim, self.planned or cohort)
        return quantizer

    def _privacy(self, record: RoundRecord, clients: int, cohort: int) -> dict[str, float]:
        """Distributed DP's ledger after the round (``clients``: whose noise is in the sum), its ``dp/`` metrics and,
        when the budget runs out, the run's ``stop_reason``."""
        noise = self.round_noise
        if noise is None:
            return {}
        epsilon = self.dp.record(noise, clients)
        stop = self.dp.stop_reason(record.round_num, noise, self.planned or cohort)
        record.stop_reason = record.stop_reason or stop
        gamma = 1.0 / (noise.levels / self.clip)  # the papers' γ = 1/s: one integer step, in the update's units
        return noise.metrics(clients) | {"dp/gamma": gamma, "dp/epsilon": epsilon, "dp/delta": self.dp.delta}

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
    ) -> tuple[dict[int, torch.Tensor], torch.Tensor, torch.Tensor, dict[str, float]]:
        """Each survivor's input in [0, 2^b) (by client id), the exact mean of their clipped updates (what the
        decoding approximates), the sum of their noise, and the ``clipped`` and ``wrapped`` counts (the latter from
        the true integer sum, which only the simulator knows)."""
        inputs, clipped_total, clipped = {}, torch.zeros_like(start), 0
        true_sum = torch.zeros(quantizer.coordinates(start.numel()), dtype=torch.int64)
        noise_sum = torch.zeros_like(true_sum)
        bound = None if self.round_noise is None else self.round_noise.l2
        for update in updates:
            delta, bound_hit = quantizer.clip_update(update.params.double() - start)
            q = quantizer.quantize(delta, rounding_generator(self.seed, round_num, update.client_id), bound)
            noise = self.client_noise(round_num, update.client_id, q.numel())
            if noise is not None:
                q, noise_sum = q + noise, noise_sum + noise
            inputs[update.client_id] = to_group(q, self.bits)
            true_sum, clipped_total, clipped = true_sum + q, clipped_total + delta, clipped + bound_hit
        half = 2 ** (self.bits - 1)
        wrapped = int(((true_sum < -half) | (true_sum >= half)).sum())
        exact = clipped_total / max(1, len(updates))
        return inputs, exact, noise_sum, {"clipped": float(clipped), "wrapped": float(wrapped)}

    def state_dict(self) -> dict[str, Any]:
        """The offsets this stage added to the exchange's ``comm/`` totals so far, and distributed DP's ledger."""
        return self.comm.state_dict() | ({"dp": self.dp.state_dict()} if self.dp.on else {})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put them back (a resume)."""
        self.comm.load_state_dict(state)
        if self.dp.on:
            self.dp.load_state_dict(state["dp"])
