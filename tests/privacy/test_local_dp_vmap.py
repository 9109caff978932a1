"""client=dpsgd under executor=vmap: the serial executor's weights within float32 rounding (logistic regression and the
2NN, clients of unequal sizes, FedProx with stragglers and momentum, models the fast clipping cannot serve), the same
ε ledger, the serial client's Poisson batches, and one-line refusals of what vmap still cannot run."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from builders import tiny_federation, tiny_server
from torch import nn

pytest.importorskip("dp_accounting")

from fedsim.cli.run import build_data, build_server, compose  # noqa: E402
from fedsim.client.federation import make_clients  # noqa: E402
from fedsim.executor import SerialExecutor, VmapExecutor, VmapUnsupportedError, Workload  # noqa: E402
from fedsim.executor.vmap.dpsgd import ExampleClipping, LinearClipping, linear_layers, poisson_batches  # noqa: E402
from fedsim.models import MLP2NN  # noqa: E402
from fedsim.observe.run_logger import RunLogger  # noqa: E402
from fedsim.privacy.local import DPSGDClient  # noqa: E402
from fedsim.strategy import LocalTraining  # noqa: E402

UNIT_ROUNDOFF = 2.0**-24  # float32
SHORT = [
    "num_rounds=3",
    "logger=quiet",
    "clients_per_round=6",
    "eval_every=3",
    "client=dpsgd",
    "client.sampling_rate=0.25",
]
PARAMETERS = {"logreg": 610, "mlp": 54_410}  # 60 features, 10 classes; the 2NN's hidden layers have 200 units


def tolerance(sequential_steps: int, longest_sum: int) -> float:
    """The relative error of the final weights that float32 rounding alone can produce between vmap and serial (the
    reasoning of tests/executor/vmap/test_vmap.py): another summation order changes a sum of ``longest_sum`` float32
    terms by about sqrt(longest_sum) unit roundoffs, once per step along the longest chain of ``sequential_steps``
    dependent steps, and successive perturbations add up at most linearly.

    A DP-SGD step's sums: each example's gradient (over a layer's fan-in), each example's squared norm over all P
    trained parameters (its rounding moves the clipping factor, and with it the whole clipped gradient), and the
    clipped sum over the batch (at most the client's examples); the noise adds no sum. So the longest is
    max(P, the largest client's examples)."""
    return sequential_steps * math.sqrt(longest_sum) * UNIT_ROUNDOFF


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def run_both(overrides: list[str], chunk_size: int = 4):  # noqa: ANN201
    serial = build_server(compose([*SHORT, *overrides]))
    vmapped = build_server(compose([*SHORT, *overrides, "executor=vmap", f"executor.chunk_size={chunk_size}"]))
    return serial, serial.run(), vmapped, vmapped.run()


@pytest.mark.parametrize("model", ["logreg", "mlp"])
def test_vmap_gives_the_serial_weights_and_the_same_epsilon(model: str) -> None:
    """Six clients of unequal sizes per round in chunks of 4 and 2 (the chunk of 2 trains eagerly: the executor's
    tail), 3 rounds of one epoch of ⌈1/0.25⌉ = 4 DP-SGD steps."""
    serial, reference, vmapped, result = run_both([f"model={model}"])
    sizes = [len(rows) for rows in build_data(compose(SHORT)).client_train]  # 32 to 569 examples
    error = relative_error(result.params, reference.params)
    assert error <= tolerance(3 * 4, max(PARAMETERS[model], max(sizes)))
    assert [r["dp/local_epsilon_max"] for r in result.history] == [r["dp/local_epsilon_max"] for r in reference.history]
    assert vmapped.parts.local_dp.steps == serial.parts.local_dp.steps and set(
        serial.parts.local_dp.steps.values()
    ) <= {4, 8, 12}
    for mine, theirs in zip(result.history, reference.history, strict=True):
        assert mine["train/loss"] == pytest.approx(theirs["train/loss"], rel=1e-5)
    assert len(set(sizes)) > 3 and min(sizes) < max(sizes) / 10, "the clients should have very different sizes"
    # the noise is what moves the weights most: the same run with less of it is far away
    quieter = build_server(compose([*SHORT, f"model={model}", "client.noise_multiplier=0.5", "executor=vmap"])).run()
    assert relative_error(quieter.params, reference.params) > 1000 * max(error, 1e-9)


def test_clip_only_dp_sgd_under_vmap_gives_the_serial_weights() -> None:
    """client.noise_multiplier=0 (clip-only): vmap's step adds 0 · noise, as the serial client does; the same
    weights within float32 rounding (the bound of the test above), the same steps, ε infinite for both."""
    serial, reference, vmapped, result = run_both(["client.noise_multiplier=0"])
    sizes = [len(rows) for rows in build_data(compose(SHORT)).client_train]
    assert relative_error(result.params, reference.params) <= tolerance(3 * 4, max(PARAMETERS["logreg"], max(sizes)))
    assert vmapped.parts.local_dp.steps == serial.parts.local_dp.steps
    assert all(vmapped.parts.local_dp.epsilon(c) == math.inf for c in vmapped.parts.local_dp.steps)
    assert [r["dp/local_epsilon_max"] for r in result.history] == [None] * 3  # inf, written as null


def test_fedprox_stragglers_and_momentum_match_serial() -> None:
    """FedProx's term (its gradient added after the noise), stragglers with 1 or 2 of 3 epochs in the same chunk (the
    longest clients finish eagerly, taking over the vectorised momentum and noise streams)."""
    overrides = [
        "model=mlp",
        "strategy=fedprox",
        "strategy.mu=0.5",
        "client.epochs=3",
        "stragglers.fraction=0.5",
        "client.optimizer.momentum=0.9",
    ]
    serial, reference, vmapped, result = run_both(overrides, chunk_size=6)
    assert len({s for s in serial.parts.local_dp.steps.values()}) > 1, "clients should do different numbers of steps"
    largest = max(len(rows) for rows in build_data(compose(SHORT)).client_train)
    assert relative_error(result.params, reference.params) <= tolerance(3 * 3 * 4, max(PARAMETERS["mlp"], largest))
    assert vmapped.parts.local_dp.steps == serial.parts.local_dp.steps


@pytest.mark.parametrize("n", [0, 1, 5, 16, 17, 60, 333])
def test_the_plan_draws_the_serial_clients_poisson_batches(n: int) -> None:
    """The plan's one rand(steps, n) must give the batches of the client's steps draws of rand(n), in its order."""
    client = DPSGDClient(0, np.arange(100, 100 + n), sampling_rate=0.3)
    rows, sizes = poisson_batches(client, torch.Generator().manual_seed(n), epochs=2)
    generator, indices = torch.Generator().manual_seed(n), torch.from_numpy(client.train_indices)
    assert len(sizes) == rows.shape[0] == 2 * math.ceil(1 / 0.3)
    for t in range(len(sizes)):  # as DPSGDClient._run_epoch draws them
        batch = indices[torch.rand(n, generator=generator) < 0.3]
        assert sizes[t] == len(batch) and torch.equal(rows[t, : sizes[t]], batch) and not rows[t, sizes[t] :].any()


def test_linear_clipping_is_every_examples_clipped_gradient_summed() -> None:
    """The fast clipping (outer products never formed) against every example's gradient by torch.func and by a plain
    autograd loop, for 3 clients with their own weights, padding masked out, some examples clipped."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4))
    model[3].bias.requires_grad_(False)
    trained = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    fixed = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    params = {n: p.unsqueeze(0) + 0.3 * torch.randn(3, *p.shape) for n, p in trained.items()}
    x, y = torch.randn(3, 7, 6) * 2, torch.randint(0, 4, (3, 7))
    mask, clip = (torch.arange(7) < torch.tensor([[7], [4], [0]])).float(), torch.tensor([0.5, 1.0, 2.0])
    loss = functools.partial(nn.functional.cross_entropy, reduction="none")
    layers = linear_layers(model, set(trained))
    assert layers is not None and [w for _, w, _ in layers.values()] == ["1.weight", "3.weight"]
    fast, fast_losses = LinearClipping(model, fixed, loss, layers)(params, x, y, mask, clip)
    numel = sum(p.numel() for p in trained.values())
    exact, losses = ExampleClipping(model, fixed, loss, numel, torch.device("cpu"))(params, x, y, mask, clip)
    clipped = 0
    for k in range(3):
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in trained:
                    p.copy_(params[n][k])
        by_hand = {n: torch.zeros_like(p) for n, p in trained.items()}
        for i in range(int(mask[k].sum())):
            model.zero_grad()
            loss(model(x[k, i : i + 1]), y[k, i : i + 1]).sum().backward()
            grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
            norm = float(torch.sqrt(sum(g.pow(2).sum() for g in grads.values())))
            clipped += norm > float(clip[k])
            for n, g in grads.items():
                by_hand[n] += g * min(1.0, float(clip[k]) / norm)
        for n in trained:
            torch.testing.assert_close(fast[n][k], by_hand[n], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(exact[n][k], by_hand[n], rtol=1e-5, atol=1e-6)
    assert clipped >= 2 and torch.allclose(fast_losses, losses, rtol=1e-5, atol=1e-6)


class TiedNet(nn.Module):
    """Every trained parameter in an nn.Linear, but the first layer's weight is also used outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(60, 10), nn.Linear(10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x))) + 0.1 * nn.functional.linear(x, self.body.weight)


class TwiceNet(nn.Module):
    """One nn.Linear applied twice per example."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(60, 60), nn.Linear(60, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(torch.tanh(self.body(x)))))


class NormNet(nn.Module):
    """A trained LayerNorm: not every trained parameter is in an nn.Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(60, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def small_data():  # noqa: ANN201
    """Synthetic(1,1): 8 devices of 20–60 examples."""
    return tiny_federation(8, size_sigma_log=0.5)


def run_small(executor, model_factory, local_client=DPSGDClient):  # noqa: ANN001, ANN201
    return tiny_server(
        small_data(),
        model=model_factory,
        client=functools.partial(local_client, sampling_rate=0.2, clip_norm=0.5, noise_multiplier=0.3),
        executor=executor,
        num_rounds=2,
        clients_per_round=5,
        seed=7,
        logger=RunLogger(None, tensorboard=False, progress=False),
    ).run()


@pytest.mark.parametrize("model_factory", [TiedNet, TwiceNet, NormNet], ids=["tied_weight", "layer_twice", "layernorm"])
def test_models_the_fast_clipping_cannot_serve_still_match_serial(model_factory) -> None:  # noqa: ANN001
    serial, vmapped = run_small(SerialExecutor(), model_factory), run_small(VmapExecutor(chunk_size=5), model_factory)
    parameters = sum(p.numel() for p in model_factory().parameters())
    assert relative_error(vmapped.params, serial.params) <= tolerance(2 * 5, max(parameters, 60))


class OwnGradientClient(DPSGDClient):
    def _private_gradient(self, model, x, y, noise):  # noqa: ANN001, ANN202
        return super()._private_gradient(model, x, y, noise)


class EagerOnlyTerm(LocalTraining):
    def loss_term(self, model: nn.Module) -> torch.Tensor | None:
        return sum(p.square().sum() for p in model.parameters())  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("client_cls", "local", "message"),
    [
        (
            OwnGradientClient,
            None,
            "executor=vmap cannot run OwnGradientClient._private_gradient (a custom _private_gradient)",
        ),
        (
            DPSGDClient,
            EagerOnlyTerm(),
            "executor=vmap cannot run the strategy's client half EagerOnlyTerm: it has no functional_term()",
        ),
    ],
)
def test_what_vmap_cannot_run_with_dp_sgd_is_refused_at_start_in_one_line(client_cls, local, message: str) -> None:  # noqa: ANN001
    data = small_data()
    workload = Workload(
        functools.partial(MLP2NN, input_shape=(60,), num_classes=10, hidden=8),
        make_clients(data, client_cls),
        data.train,
        local=local,
    )
    with pytest.raises(VmapUnsupportedError) as error:
        VmapExecutor().start(workload)
    assert message in str(error.value) and "\n" not in str(error.value)
