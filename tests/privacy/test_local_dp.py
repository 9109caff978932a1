"""DP-SGD in local training (client=dpsgd): the private gradient against a per-example autograd loop, the ledger's
ε against the library, the same weights under every executor, exact resume, and one-line refusals."""

from __future__ import annotations

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
    steps = server.local_dp.steps
    assert set(steps.values()) <= {4, 8, 12} and max(steps.values()) == result.history[-1]["dp/local_steps_max"]
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(
        dp_accounting.PoissonSampledDpEvent(0.25, dp_accounting.GaussianDpEvent(1.0)), max(steps.values())
    )
    assert result.history[-1]["dp/local_epsilon_max"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    assert result.history[-1]["dp/local_epsilon_max"] == PrivacyLedger(0.25, 1.0, 1e-5).epsilon(max(steps.values()))


@pytest.mark.parametrize("workers", [1, 3])
def test_process_workers_give_the_serial_weights(workers: int, local_reference) -> None:  # noqa: ANN001
    _, reference = local_reference
    result = build_server(
        compose([*SHORT, "executor=process", "executor.devices=cpu", f"executor.workers={workers}"])
    ).run()
    assert torch.equal(result.params, reference.params)
    assert [r["dp/local_epsilon_max"] for r in result.history] == [r["dp/local_epsilon_max"] for r in reference.history]


def test_resume_continues_every_clients_ledger(tmp_path: Path, local_reference) -> None:  # noqa: ANN001
    server, reference = local_reference
    first = tmp_path / "first"
    build_server(compose([*SHORT, "num_rounds=2", "checkpoint_every=1"]), first).run()
    again = build_server(compose([*SHORT, f"resume={first}"]), tmp_path / "second")
    result = again.run()
    assert torch.equal(result.params, reference.params) and again.local_dp.steps == server.local_dp.steps


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["executor=vmap", "strategy=ditto"], "executor=vmap cannot run the strategy's client half PersonalModel"),
        (["client.sampling_rate=0"], "client.sampling_rate must be in (0, 1]"),
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
