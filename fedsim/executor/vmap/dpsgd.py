"""DP-SGD clients (``client=dpsgd``, :class:`~fedsim.privacy.local.DPSGDClient`) under ``executor=vmap``.

What :meth:`DPSGDClient._run_epoch` does one client at a time, here for a chunk of clients at once:

* the plan draws every Poisson batch of a task up front from the task's generator, in the client's order
  (:func:`poisson_batches`); the noise has a stream of its own, so drawing the batches first changes nothing;
* a step clips every example's gradient to the client's ``clip_norm`` over all trainable parameters and sums
  them (padding examples weigh 0): :class:`LinearClipping` for models made of ``nn.Linear`` layers (logistic
  regression, MLPs) without forming any example's gradient, :class:`ExampleClipping` for any other model (a
  ``vmap`` over the examples inside the ``vmap`` over the clients); then it adds the Gaussian noise of each
  task's own noise generator (drawn on the CPU, per client one ``randn`` per trainable parameter in
  ``named_parameters`` order, as the client draws it), divides by ``q·n`` and adds the gradient of the
  strategy's functional term; the optimizer steps in :mod:`fedsim.executor.vmap.train`;
* the steps of a chunk's last clients run eagerly with the client's own :meth:`DPSGDClient._private_gradient`.

So a client's update equals the serial executor's up to float rounding. A step's batches are padded to the
widest batch of that step only (Poisson batches vary in size from step to step). What it costs next to
non-private vmap (the noise, drawn on one CPU core, and the padding of Poisson batches): docs/performance.md,
``experiments/bench/bench_dpsgd_vmap.py``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeGuard, cast

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, grad_and_value, vmap

from fedsim.client.base import Client
from fedsim.client.local_training import LocalTraining
from fedsim.core.seeding import dpsgd_noise_seed
from fedsim.privacy.local import DPSGDClient

Tensors = dict[str, torch.Tensor]
Clipped = tuple[Tensors, torch.Tensor]  # the sums of the clipped example gradients (n, *shape), the losses (n, width)

# DPSGDClient's own pieces of the local loop, which executor=vmap replaces (a subclass must not override them).
PRIVATE_LOOP = ("_train", "_run_epoch", "_private_gradient", "_example_loss")


def is_private(client: Client) -> TypeGuard[DPSGDClient]:
    return isinstance(client, DPSGDClient)


def poisson_batches(
    client: DPSGDClient, generator: torch.Generator, epochs: int
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Every step's Poisson batch, as :meth:`DPSGDClient._run_epoch` draws them: rows ``(steps, widest)``
    (``rows[t, :sizes[t]]``, in the client's order; the rest is padding at row 0) and the batch sizes.

    One ``rand(steps, n)`` gives the numbers of ``steps`` draws of ``rand(n)`` (torch's CPU uniform consumes the
    generator one element after another; ``tests/privacy/test_local_dp_vmap.py`` checks it)."""
    steps = epochs * client.steps_per_epoch
    keep = (torch.rand(steps, client.num_train, generator=generator) < client.sampling_rate).numpy()
    batches = [client.train_indices[chosen] for chosen in keep]
    rows = np.zeros((steps, max([len(b) for b in batches] + [1])), dtype=np.int64)
    for t, batch in enumerate(batches):
        rows[t, : len(batch)] = batch
    return torch.from_numpy(rows), tuple(len(b) for b in batches)


class PrivateGradient:
    """The noisy clipped gradient of a chunk's live clients at one step (the first ``n`` of ``plans``, which come
    longest first), and each client's noise generator, which the eager tail continues."""

    def __init__(
        self,
        model: nn.Module,
        fixed: Tensors,
        anchor: Tensors,
        local: LocalTraining | None,
        plans: Sequence[Any],
        data: Any,
        device: torch.device,
    ) -> None:
        clients: list[DPSGDClient] = [p.client for p in plans]
        self.data, self.device = data, device
        self.noise = [torch.Generator().manual_seed(dpsgd_noise_seed(p.task.seed)) for p in plans]
        self.names = [n for n, p in model.named_parameters() if n in anchor]  # the clients' noise order
        self.buffers = {
            n: torch.empty(len(plans), *anchor[n].shape) for n in self.names
        }  # CPU, where the noise is drawn
        self.draws = [[self.buffers[n][k] for n in self.names] for k in range(len(plans))]  # client k's, in its order
        self.clip = _per_client([c.clip_norm for c in clients], device)
        self.scale = _per_client([c.noise_multiplier * c.clip_norm for c in clients], device)
        self.expected = _per_client([c.sampling_rate * c.num_train for c in clients], device)
        self.widths = [
            max([p.sizes[t] for p in plans if p.num_steps > t] + [1]) for t in range(max(p.num_steps for p in plans))
        ]
        per_example_loss = clients[0].per_example_loss
        self.model = model
        self.examples = ExampleClipping(model, fixed, per_example_loss, sum(v.numel() for v in anchor.values()), device)
        layers = linear_layers(model, set(anchor))
        self.linear = None if layers is None else LinearClipping(model, fixed, per_example_loss, layers)
        self.term = _term_gradient(local, anchor)

    def __call__(
        self, t: int, params: Tensors, rows: torch.Tensor, mask: torch.Tensor, numbers: Tensors
    ) -> tuple[Tensors, torch.Tensor]:
        """Gradients ``{name: (n, *shape)}`` and each client's mean loss over its batch, for the ``n = len(rows)``
        live clients at step ``t`` (``rows``, ``mask``: ``(n, width)``, cut here to the step's widest batch)."""
        n, width = rows.shape[0], self.widths[t]
        rows, mask = rows[:, :width], mask[:, :width]
        x, y = _gather(self.data.x, rows), _gather(self.data.y, rows)
        summed, losses = self._clipping(params, x, y)(params, x, y, mask, self.clip[:n])
        noise = self._draw(n)
        for name, value in summed.items():  # (sum + noise · z·C) / (q·n), in place
            value.addcmul_(noise[name], _like(self.scale[:n], value)).div_(_like(self.expected[:n], value))
        if self.term is not None:
            for name, g in self.term(params, numbers).items():
                summed[name] += g
        return summed, (losses * mask).sum(1) / mask.sum(1).clamp(min=1)

    def _clipping(self, params: Tensors, x: torch.Tensor, y: torch.Tensor) -> Callable[..., Clipped]:
        """:class:`LinearClipping` if the model is made for it, else :class:`ExampleClipping`. Whether it is, is
        checked once per model (at start-up, by the executor's probe): on this step's examples, the two must
        give the same clipped sums. Every trained parameter in an ``nn.Linear`` is not enough: a layer may run
        twice or on a sequence, or its weight may also be used outside it (tied weights)."""
        if self.linear is None:
            return self.examples
        if self.model not in _LINEAR_MODELS:
            _LINEAR_MODELS[self.model] = self._linear_agrees(params, x, y)
        return self.linear if _LINEAR_MODELS[self.model] else self.examples

    def _linear_agrees(self, params: Tensors, x: torch.Tensor, y: torch.Tensor) -> bool:
        assert self.linear is not None
        mask, clip = torch.ones(y.shape[:2], device=x.device), self.clip[: len(x)]
        try:
            fast, _ = self.linear(params, x, y, mask, clip)
        except NotPerExample:
            return False
        exact, _ = self.examples(params, x, y, mask, clip)
        return all(
            float((fast[name] - value).norm()) <= 1e-4 * float(value.norm()) + 1e-6 for name, value in exact.items()
        )

    def _draw(self, n: int) -> Tensors:
        """Each of the first ``n`` clients' noise for one step, from its own generator in its own order."""
        for generator, draws in zip(self.noise[:n], self.draws, strict=False):
            for draw in draws:
                draw.normal_(generator=generator)
        return {name: buffer[:n].to(self.device) for name, buffer in self.buffers.items()}

    def eager_step(self, client: Client, i: int) -> Callable[..., torch.Tensor]:
        """Client ``i``'s steps after it leaves the vectorised calls, as :meth:`DPSGDClient._run_epoch` takes them:
        the private gradient into ``.grad`` from its noise generator (where the vectorised steps left it) and
        the strategy's ``loss_term``; returns the batch's mean loss (the optimizer steps after)."""
        private = cast(DPSGDClient, client)  # a chunk is of one client class: DP-SGD clients here

        def gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, local: LocalTraining | None) -> torch.Tensor:
            loss_sum = private._private_gradient(model, x, y, self.noise[i])
            term = local.loss_term(model) if local is not None else None
            if term is not None:
                term.backward()
            return x.new_tensor(loss_sum / max(len(x), 1), dtype=torch.float32)

        return gradient


# Per model (one per device, for the run): whether LinearClipping gives its clipped sums (PrivateGradient._clipping).
_LINEAR_MODELS: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


class NotPerExample(RuntimeError):
    """A linear layer met something other than one vector per example (or ran twice): clip per example instead."""


class LinearClipping:
    """Per-example clipping without per-example gradients, for models whose trainable parameters are all weights
    and biases of ``nn.Linear`` layers, each applied once to one vector per example (logistic regression, MLPs).

    Example i's gradient of such a layer is the outer product g_i a_iᵀ of the loss gradient at the layer's output
    and the layer's input (g_i for the bias), so its squared norm is ‖g_i‖²(‖a_i‖² + 1) and the sum of the clipped
    gradients is one matrix product, Gᵀ diag(f) A (Goodfellow 2015, "Efficient per-example gradient computations"):
    the cost of an ordinary batch gradient, where materialising every example's gradient costs the batch width
    times the model in memory traffic (12× a batch gradient for the 2NN here). Forward hooks record each layer's
    input and add a zero "tap" to its output, whose gradient is g."""

    def __init__(
        self,
        model: nn.Module,
        fixed: Tensors,
        per_example_loss: Callable[..., torch.Tensor],
        layers: dict[str, tuple[nn.Linear, str | None, str | None]],
    ) -> None:
        self.layers = layers

        def loss(taps: Tensors, params: Tensors, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Any]:
            inputs: Tensors = {}
            with self._tapped(taps, inputs, len(x)):
                losses = per_example_loss(functional_call(model, {**fixed, **params}, (x,)), y)
            return losses.sum(), (losses, inputs)

        self.taps = vmap(grad(loss, has_aux=True))

    def __call__(
        self, params: Tensors, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, clip: torch.Tensor
    ) -> Clipped:
        """The sums of the clipped example gradients ``{name: (n, *shape)}`` and the examples' losses ``(n, width)``."""
        taps = {name: x.new_zeros(*y.shape, layer.out_features) for name, (layer, _, _) in self.layers.items()}
        outputs, (losses, inputs) = self.taps(taps, params, x, y)
        squared = torch.zeros_like(losses)
        for name, (_, weight, bias) in self.layers.items():
            scale = (_squared_norms(inputs[name]) if weight else 0.0) + (1.0 if bias else 0.0)
            squared += _squared_norms(outputs[name]) * scale
        factors = (clip[:, None] / squared.sqrt().clamp_min(1e-12)).clamp(max=1.0) * mask
        summed = {}
        for name, (_, weight, bias) in self.layers.items():
            weighted = outputs[name] * factors.unsqueeze(2)  # (n, width, out)
            if weight:
                summed[weight] = torch.bmm(weighted.transpose(1, 2), inputs[name])
            if bias:
                summed[bias] = weighted.sum(1)
        return summed, losses

    @contextlib.contextmanager
    def _tapped(self, taps: Tensors, inputs: Tensors, width: int) -> Iterator[None]:
        def hook(name: str) -> Callable[..., torch.Tensor]:
            def tap(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
                if name in inputs or args[0].dim() != 2 or args[0].shape[0] != width:
                    raise NotPerExample(name)
                inputs[name] = args[0]
                return output + taps[name]

            return tap

        handles = [layer.register_forward_hook(hook(name)) for name, (layer, _, _) in self.layers.items()]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
        if len(inputs) != len(self.layers):
            raise NotPerExample("a linear layer did not run")


def linear_layers(model: nn.Module, trainable: set[str]) -> dict[str, tuple[nn.Linear, str | None, str | None]] | None:
    """``{module name: (layer, its trained weight's name or None, its trained bias's name or None)}`` when every
    trained parameter belongs to an ``nn.Linear`` (that appears once in the model), else ``None``."""
    layers: dict[str, tuple[nn.Linear, str | None, str | None]] = {}
    covered: set[str] = set()
    modules = list(model.named_modules(remove_duplicate=False))
    for name, module in modules:
        if type(module) is not nn.Linear:
            continue
        names = [f"{name}.{p}" if name else p for p in ("weight", "bias")]
        weight, bias = (n if n in trainable else None for n in names)
        if weight or bias:
            layers[name] = (module, weight, bias)
            covered.update(n for n in (weight, bias) if n)
    if covered != trainable or len({id(m) for _, m in modules}) != len(modules):
        return None
    return layers


class ExampleClipping:
    """Per-example clipping for any model: every example's gradient (a ``vmap`` over the examples inside the ``vmap``
    over the clients), clipped and summed, for as many clients at a time as keep those gradients within a budget."""

    def __init__(
        self,
        model: nn.Module,
        fixed: Tensors,
        per_example_loss: Callable[..., torch.Tensor],
        numel: int,
        device: torch.device,
    ) -> None:
        self.numel, self.budget = numel, _EXAMPLE_GRADIENT_BYTES["cuda" if device.type == "cuda" else "cpu"]
        self.grads = vmap(vmap(grad_and_value(_example_loss(model, fixed, per_example_loss)), in_dims=(None, 0, 0)))

    def __call__(
        self, params: Tensors, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, clip: torch.Tensor
    ) -> Clipped:
        n, width = y.shape
        step = max(1, self.budget // (4 * width * max(self.numel, 1)))
        pieces = [
            self._clipped(
                {k: v[i : i + step] for k, v in params.items()},
                x[i : i + step],
                y[i : i + step],
                mask[i : i + step],
                clip[i : i + step],
            )
            for i in range(0, n, step)
        ]
        if len(pieces) == 1:
            return pieces[0]
        return {k: torch.cat([s[k] for s, _ in pieces]) for k in pieces[0][0]}, torch.cat([loss for _, loss in pieces])

    def _clipped(
        self, params: Tensors, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, clip: torch.Tensor
    ) -> Clipped:
        grads, losses = self.grads(params, x, y)
        flat = {name: g.flatten(2) for name, g in grads.items()}
        norms = torch.stack([torch.linalg.vector_norm(g, dim=2) for g in flat.values()]).square().sum(0).sqrt()
        factors = (clip[:, None] / norms.clamp_min(1e-12)).clamp(max=1.0) * mask
        summed = {name: torch.bmm(factors.unsqueeze(1), g).view_as(grads[name][:, 0]) for name, g in flat.items()}
        return summed, losses


# Every example's gradient, at most this many bytes at a time (clients per call are cut to fit).
_EXAMPLE_GRADIENT_BYTES = {"cpu": 64 * 2**20, "cuda": 2 * 2**30}


def _example_loss(
    model: nn.Module, fixed: Tensors, per_example_loss: Callable[..., torch.Tensor]
) -> Callable[..., torch.Tensor]:
    def loss(params: Tensors, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, {**fixed, **params}, (x.unsqueeze(0),))
        return per_example_loss(out, y.unsqueeze(0)).sum()

    return loss


def _term_gradient(local: LocalTraining | None, anchor: Tensors) -> Callable[[Tensors, Tensors], Tensors] | None:
    """The gradient of the strategy's functional term per client (data-independent: not clipped, no noise), or
    ``None`` without one; a term that is ``None`` for this config has a zero gradient."""
    if local is None:
        return None

    def term(params: Tensors, numbers: Tensors) -> torch.Tensor:
        value = local.functional_term(params, anchor, numbers)
        return value if value is not None else cast(torch.Tensor, sum(p.sum() for p in params.values())) * 0.0

    return vmap(grad(term))


def _squared_norms(rows: torch.Tensor) -> torch.Tensor:
    """``(n, width, d)`` → ``(n, width)``: each vector's squared norm (``square()`` is 5× slower here)."""
    return (rows * rows).sum(2)


def _per_client(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)


def _like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A ``(n,)`` tensor shaped to broadcast against ``like`` (``(n, ...)``)."""
    return value.view(-1, *([1] * (like.dim() - 1)))


def _gather(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``values[rows]`` for a 2-D ``rows`` (as :func:`fedsim.executor.vmap.train._gather`, which imports this
    module)."""
    return values.index_select(0, rows.reshape(-1)).view(*rows.shape, *values.shape[1:])
