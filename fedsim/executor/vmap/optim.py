"""Functional SGD and Adam over stacked per-client parameters, for :mod:`fedsim.executor.vmap`.

They follow the single-tensor update rules of ``torch.optim.SGD`` and ``torch.optim.Adam`` (PyTorch 2.x)
for K clients at once: every tensor has a leading client dimension and every numeric hyper-parameter is
a tensor of shape ``(K,)`` (clients may differ, e.g. in their learning rate). Updates are in place, so
a caller may pass views of a prefix of the clients (those that still have steps to do).

Adam here is PyTorch's (with bias correction), which is what ``client=adam`` trains with serially.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensors = dict[str, torch.Tensor]

_SGD_KEYS = ("lr", "momentum", "dampening", "weight_decay")
_ADAM_KEYS = ("lr", "beta1", "beta2", "eps", "weight_decay")


class VmapUnsupportedError(ValueError):
    """Something in the workload cannot be vectorised; the message names it and the alternative."""


@dataclass(frozen=True)
class OptimizerSpec:
    """What one client's optimizer is: ``kind`` and ``flags`` must match within a chunk, ``hyper`` may differ."""

    kind: str  # "sgd" or "adam"
    flags: tuple[tuple[str, bool], ...]  # structural options: nesterov, uses momentum
    hyper: tuple[tuple[str, float], ...]

    @property
    def group_key(self) -> tuple[str, tuple[tuple[str, bool], ...]]:
        return self.kind, self.flags


def optimizer_spec(optimizer: torch.optim.Optimizer) -> OptimizerSpec:
    """Read the kind and hyper-parameters of a freshly built optimizer; refuse what vmap cannot replicate."""
    if len(optimizer.param_groups) != 1:
        raise VmapUnsupportedError("executor=vmap needs an optimizer with one parameter group; use executor=process")
    group = optimizer.param_groups[0]
    unsupported = [k for k in ("maximize", "amsgrad", "differentiable") if group.get(k)]
    if unsupported:
        raise VmapUnsupportedError(
            f"executor=vmap does not replicate the optimizer option {unsupported[0]}=True; use executor=process"
        )
    if type(optimizer) is torch.optim.SGD:
        hyper = {k: float(group[k]) for k in _SGD_KEYS}
        flags = (("nesterov", bool(group["nesterov"])), ("momentum", hyper["momentum"] != 0.0))
        return OptimizerSpec("sgd", flags, tuple(hyper.items()))
    if type(optimizer) is torch.optim.Adam:
        beta1, beta2 = group["betas"]
        hyper = {
            "lr": float(group["lr"]),
            "beta1": float(beta1),
            "beta2": float(beta2),
            "eps": float(group["eps"]),
            "weight_decay": float(group["weight_decay"]),
        }
        return OptimizerSpec("adam", (), tuple(hyper.items()))
    raise VmapUnsupportedError(
        f"executor=vmap trains with SGD (with or without momentum) or Adam, not {type(optimizer).__name__}; "
        "use executor=process"
    )


def stack_hyper(specs: list[OptimizerSpec], device: torch.device) -> Tensors:
    """One ``(K,)`` float32 tensor per hyper-parameter, in client order."""
    names = [name for name, _ in specs[0].hyper]
    return {
        name: torch.tensor([dict(s.hyper)[name] for s in specs], dtype=torch.float32, device=device) for name in names
    }


def init_state(spec: OptimizerSpec, params: Tensors) -> Tensors:
    """Zero optimizer state for stacked ``params`` (SGD without momentum has none)."""
    if spec.kind == "sgd":
        return {f"buf.{n}": torch.zeros_like(p) for n, p in params.items()} if dict(spec.flags)["momentum"] else {}
    k = next(iter(params.values())).shape[0]
    state = {f"m.{n}": torch.zeros_like(p) for n, p in params.items()}
    state.update({f"v.{n}": torch.zeros_like(p) for n, p in params.items()})
    state["step"] = torch.zeros(k, dtype=torch.float64, device=next(iter(params.values())).device)
    return state


def step(
    spec: OptimizerSpec,
    params: Tensors,
    grads: Tensors,
    state: Tensors,
    hyper: Tensors,
    first: bool,
    decay: bool = True,
) -> None:
    """One optimizer step for every client, in place on ``params`` and ``state`` (``grads`` are consumed).
    ``first``: no client has stepped before. ``decay=False``: no client has weight decay (see
    :func:`any_decay`; deciding it from ``hyper`` would wait for a GPU on every step)."""
    if decay:
        _decay(grads, params, hyper)
    if spec.kind == "sgd":
        _sgd(dict(spec.flags), params, grads, state, hyper, first)
    else:
        _adam(params, grads, state, hyper)


def any_decay(specs: list[OptimizerSpec]) -> bool:
    """Whether any of these clients' optimizers has weight decay."""
    return any(dict(s.hyper)["weight_decay"] != 0.0 for s in specs)


def _per_client(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape a ``(K,)`` tensor to broadcast against ``like`` (``(K, ...)``)."""
    return value.view(-1, *([1] * (like.dim() - 1)))


def _decay(grads: Tensors, params: Tensors, hyper: Tensors) -> None:
    """``g ← g + λ·p`` (L2 weight decay, as torch.optim adds it to the gradient)."""
    for name, g in grads.items():
        g.addcmul_(_per_client(hyper["weight_decay"], g), params[name])


def _sgd(flags: dict[str, bool], params: Tensors, grads: Tensors, state: Tensors, hyper: Tensors, first: bool) -> None:
    for name, p in params.items():
        g = grads[name]
        if flags["momentum"]:
            buf = state[f"buf.{name}"]
            if first:  # torch.optim.SGD: the first step's buffer is the gradient itself
                buf.copy_(g)
            else:
                buf.mul_(_per_client(hyper["momentum"], buf)).addcmul_(_per_client(1 - hyper["dampening"], buf), g)
            g = g.addcmul_(_per_client(hyper["momentum"], g), buf) if flags["nesterov"] else buf
        p.addcmul_(_per_client(-hyper["lr"], p), g)


def _adam(params: Tensors, grads: Tensors, state: Tensors, hyper: Tensors) -> None:
    state["step"] += 1
    bias1 = (1 - hyper["beta1"].double() ** state["step"]).float()
    bias2_sqrt = (1 - hyper["beta2"].double() ** state["step"]).sqrt().float()
    step_size = -hyper["lr"] / bias1
    for name, p in params.items():
        g, m, v = grads[name], state[f"m.{name}"], state[f"v.{name}"]
        m.lerp_(g, _per_client(1 - hyper["beta1"], m))
        v.mul_(_per_client(hyper["beta2"], v)).addcmul_(g * _per_client(1 - hyper["beta2"], g), g)
        denom = v.sqrt().div_(_per_client(bias2_sqrt, v)).add_(_per_client(hyper["eps"], v))
        p.addcdiv_(m * _per_client(step_size, m), denom)


def to_torch_state(
    spec: OptimizerSpec, optimizer: torch.optim.Optimizer, named: dict[str, torch.nn.Parameter], state: Tensors, i: int
) -> None:
    """Give a fresh ``torch.optim`` optimizer client ``i``'s state (after at least one vectorised step), so
    that it continues exactly where the vectorised optimizer stopped. Adam's ``step`` is a float32 tensor
    on the CPU, or on the parameter's device for ``capturable``/``fused`` Adam, as torch.optim keeps it."""
    group = optimizer.param_groups[0]
    step_device = "cpu" if not (group.get("capturable") or group.get("fused")) else None
    for name, param in named.items():
        if spec.kind == "sgd" and dict(spec.flags)["momentum"]:
            optimizer.state[param]["momentum_buffer"] = state[f"buf.{name}"][i].clone()
        elif spec.kind == "adam":
            step = torch.tensor(float(state["step"][i]), dtype=torch.float32, device=step_device or param.device)
            optimizer.state[param].update(
                step=step,
                exp_avg=state[f"m.{name}"][i].clone(),
                exp_avg_sq=state[f"v.{name}"][i].clone(),
            )
