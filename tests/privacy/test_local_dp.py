"""DP-SGD in local training (client=dpsgd): the private gradient against a per-example autograd loop, the ledger's
ε against the library, the same weights under every executor, exact resume, and one-line refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("dp_accounting")

from fedsim.cli.run import build_server, compose  # noqa: E402
from fedsim.privacy.accountant import PrivacyLedger  # noqa: E402
from fedsim.privacy.local import DPSGDClient  # noqa: E402

SHORT = [
    "num_rounds=3",
    "logger=quiet",
    "clients_per_round=4",
    "eval_every=3",
    "client=dpsgd",
    "client.sampling_rate=0.25",
]


def test_the_private_gradient_is_the_noisy_mean_of_clipped_per_example_gradients() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    client = DPSGDClient(0, list(range(40)), noise_multiplier=0.7, clip_norm=0.5, sampling_rate=0.2)
    x, y = torch.randn(6, 5) * 3, torch.tensor([0, 1, 2, 0, 1, 2])
    client._private_gradient(model, x, y, torch.Generator().manual_seed(11))
    private = [p.grad.clone() for p in model.parameters()]
    # the same by hand: one example at a time through autograd, clipped over all parameters
    summed = [torch.zeros_like(p) for p in model.parameters()]
    clipped = 0
    for i in range(len(x)):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads = [p.grad for p in model.parameters()]
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        clipped += norm > 0.5
        summed = [s + g * min(1.0, 0.5 / float(norm)) for s, g in zip(summed, grads, strict=True)]
    generator = torch.Generator().manual_seed(11)
    noise = [torch.randn(p.shape, generator=generator) for p in model.parameters()]
    expected = [(s + n * 0.7 * 0.5) / (0.2 * 40) for s, n in zip(summed, noise, strict=True)]
    assert clipped >= 1  # the example exercises clipping
    for got, want in zip(private, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def local_reference():
    server = build_server(compose(SHORT))
    return server, server.run()


def test_each_clients_epsilon_is_the_librarys_for_its_poisson_steps(local_reference) -> None:  # noqa: ANN001
    import dp_accounting

    server, result = local_reference
    steps = server.parts.local_dp.steps
    assert set(steps.values()) <= {4, 8, 12} and max(steps.values()) == result.history[-1]["dp/local_steps_max"]
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(
        dp_accounting.PoissonSampledDpEvent(0.25, dp_accounting.GaussianDpEvent(1.0)), max(steps.values())
    )
    assert result.history[-1]["dp/local_epsilon_max"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    assert result.history[-1]["dp/local_epsilon_max"] == PrivacyLedger(0.25, 1.0, 1e-5).epsilon(max(steps.values()))


# three workers for more clients than that: one worker trains several clients in turn (all that a single
# worker would show) while the others' results arrive in any order
def test_process_workers_give_the_serial_weights(local_reference) -> None:  # noqa: ANN001
    _, reference = local_reference
    result = build_server(compose([*SHORT, "executor=process", "executor.devices=cpu", "executor.workers=3"])).run()
    assert torch.equal(result.params, reference.params)
    assert [r["dp/local_epsilon_max"] for r in result.history] == [r["dp/local_epsilon_max"] for r in reference.history]


def test_resume_continues_every_clients_ledger(tmp_path: Path, local_reference) -> None:  # noqa: ANN001
    server, reference = local_reference
    first = tmp_path / "first"
    build_server(compose([*SHORT, "num_rounds=2", "checkpoint_every=1"]), first).run()
    again = build_server(compose([*SHORT, f"resume={first}"]), tmp_path / "second")
    result = again.run()
    assert torch.equal(result.params, reference.params) and again.parts.local_dp.steps == server.parts.local_dp.steps


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["executor=vmap", "strategy=ditto"], "executor=vmap cannot run the strategy's client half PersonalModel"),
        (["client.sampling_rate=0"], "client.sampling_rate must be in (0, 1]"),
        (["client.noise_multiplier=-0.5"], "client.noise_multiplier must be a finite number >= 0 (got -0.5); 0 is"),
        (["client.noise_multiplier=nan"], "client.noise_multiplier must be a finite number"),
    ],
)
def test_what_dp_sgd_cannot_run_is_refused_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError) as error:
        build_server(compose([*SHORT, *overrides]))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_batchnorm_models_and_mixed_clients_are_refused() -> None:
    from fedsim.client.base import Client
    from fedsim.privacy.local import local_ledger

    private = [DPSGDClient(i, [0, 1]) for i in range(2)]
    with pytest.raises(ValueError, match="^client=dpsgd: the model has BatchNorm1d"):
        local_ledger(private, nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    with pytest.raises(ValueError, match="^client: DP-SGD clients must be all the clients"):
        local_ledger([*private, Client(2, [0])], nn.Linear(2, 2))
    assert local_ledger([Client(0, [0])], nn.Linear(2, 2)) is None


def test_clip_only_gradient_is_the_mean_of_clipped_per_example_gradients_whatever_the_noise_stream() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    client = DPSGDClient(0, list(range(40)), noise_multiplier=0.0, clip_norm=0.5, sampling_rate=0.2)
    x, y = torch.randn(6, 5) * 3, torch.tensor([0, 1, 2, 0, 1, 2])
    grads = []
    for seed in (11, 12):  # z = 0: the noise, drawn from either stream, is multiplied by 0
        client._private_gradient(model, x, y, torch.Generator().manual_seed(seed))
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    summed = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(len(x)):  # by hand, as in the test with noise above
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
        summed = [s + p.grad * min(1.0, 0.5 / float(norm)) for s, p in zip(summed, model.parameters(), strict=True)]
    for got, want in zip(grads[0], summed, strict=True):
        torch.testing.assert_close(got, want / (0.2 * 40), rtol=1e-5, atol=1e-6)


def test_clip_only_epsilon_is_infinite_after_a_step_and_zero_before() -> None:
    import dp_accounting

    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.PoissonSampledDpEvent(0.25, dp_accounting.GaussianDpEvent(0.0)), 4)
    assert accountant.get_epsilon(1e-5) == math.inf  # the library's own answer for a Gaussian without noise
    ledger = PrivacyLedger(0.25, 0.0, 1e-5)
    assert ledger.epsilon(0) == 0.0 and ledger.epsilon(1) == ledger.epsilon(40) == math.inf
    assert ledger.record() == math.inf and ledger.rounds == 1


def test_a_clip_only_run_trains_warns_and_reports_infinite_epsilon(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="fedsim"):
        server = build_server(compose([*SHORT, "client.noise_multiplier=0"]))
    assert "client.noise_multiplier=0: DP-SGD clips the per-example gradients but adds no noise" in caplog.text
    result = server.run()
    assert bool(torch.isfinite(result.params).all())
    steps = server.parts.local_dp.steps
    assert steps and all(server.parts.local_dp.epsilon(c) == math.inf for c in steps)
    assert server.parts.local_dp.epsilon(max(steps) + 1000) == 0.0  # a client that never trained has spent nothing
    # inf in the round's metrics; the history (as metrics.jsonl) holds it as null, like every non-finite metric
    assert [r["dp/local_epsilon_max"] for r in result.history] == [None] * 3
    assert result.history[-1]["dp/local_steps_max"] == max(steps.values())
