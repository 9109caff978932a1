"""Functional SGD and Adam over stacked per-client parameters, for :mod:`fedsim.executor.vmap`.

They follow the single-tensor update rules of ``torch.optim.SGD`` and ``torch.optim.Adam`` (PyTorch 2.x)
for K clients at once: every tensor has a leading client dimension, every numeric hyper-parameter is a
tensor of shape ``(K,)`` (clients may differ, e.g. in their learning rate), and a client whose ``active``
flag is false at a step keeps its parameters and optimizer state unchanged. That is how a client with
fewer local steps than the longest one in its chunk does exactly the steps it would do alone.

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
        raise VmapUnsupportedError(f"executor=vmap does not replicate the optimizer option {unsupported[0]}=True; use executor=process")
    if type(optimizer) is torch.optim.SGD:
        hyper = {k: float(group[k]) for k in _SGD_KEYS}
        flags = (("nesterov", bool(group["nesterov"])), ("momentum", hyper["momentum"] != 0.0))
        return OptimizerSpec("sgd", flags, tuple(hyper.items()))
    if type(optimizer) is torch.optim.Adam:
        beta1, beta2 = group["betas"]
        hyper = {"lr": float(group["lr"]), "beta1": float(beta1), "beta2": float(beta2),
                 "eps": float(group["eps"]), "weight_decay": float(group["weight_decay"])}
        return OptimizerSpec("adam", (), tuple(hyper.items()))
    raise VmapUnsupportedError(
        f"executor=vmap trains with SGD (with or without momentum) or Adam, not {type(optimizer).__name__}; use executor=process"
    )


def stack_hyper(specs: list[OptimizerSpec], device: torch.device) -> Tensors:
    """One ``(K,)`` float32 tensor per hyper-parameter, in client order."""
    names = [name for name, _ in specs[0].hyper]
    return {name: torch.tensor([dict(s.hyper)[name] for s in specs], dtype=torch.float32, device=device) for name in names}


def init_state(spec: OptimizerSpec, params: Tensors) -> Tensors:
    """Zero optimizer state for stacked ``params`` (SGD without momentum has none)."""
    if spec.kind == "sgd":
        return {f"buf.{n}": torch.zeros_like(p) for n, p in params.items()} if dict(spec.flags)["momentum"] else {}
    k = next(iter(params.values())).shape[0]
    state = {f"m.{n}": torch.zeros_like(p) for n, p in params.items()}
    state.update({f"v.{n}": torch.zeros_like(p) for n, p in params.items()})
    state["step"] = torch.zeros(k, dtype=torch.float64, device=next(iter(params.values())).device)
    return state


def step(spec: OptimizerSpec, params: Tensors, grads: Tensors, state: Tensors, hyper: Tensors,
         active: torch.Tensor, first: bool) -> tuple[Tensors, Tensors]:
    """One optimizer step for every active client. ``first``: no client has stepped before."""
    if spec.kind == "sgd":
        return _sgd(dict(spec.flags), params, grads, state, hyper, active, first)
    return _adam(params, grads, state, hyper, active)


def _per_client(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape a ``(K,)`` tensor to broadcast against ``like`` (``(K, ...)``)."""
    return value.view(-1, *([1] * (like.dim() - 1)))


def _keep_inactive(active: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.where(_per_client(active, new), new, old)


def _sgd(flags: dict[str, bool], params: Tensors, grads: Tensors, state: Tensors, hyper: Tensors,
         active: torch.Tensor, first: bool) -> tuple[Tensors, Tensors]:
    new_params, new_state = {}, {}
    for name, p in params.items():
        g = grads[name] + _per_client(hyper["weight_decay"], p) * p
        if flags["momentum"]:
            old_buf = state[f"buf.{name}"]
            if first:  # torch.optim.SGD: the first step's buffer is the gradient itself
                buf = g
            else:
                buf = _per_client(hyper["momentum"], p) * old_buf + _per_client(1 - hyper["dampening"], p) * g
            g = g + _per_client(hyper["momentum"], p) * buf if flags["nesterov"] else buf
            new_state[f"buf.{name}"] = _keep_inactive(active, buf, old_buf)
        new_params[name] = _keep_inactive(active, p - _per_client(hyper["lr"], p) * g, p)
    return new_params, new_state


def _adam(params: Tensors, grads: Tensors, state: Tensors, hyper: Tensors,
          active: torch.Tensor) -> tuple[Tensors, Tensors]:
    steps = state["step"] + active.to(torch.float64)
    t = steps.clamp(min=1)  # inactive clients that never stepped: any finite value, their update is discarded
    bias1 = (1 - hyper["beta1"].double() ** t).float()
    bias2_sqrt = (1 - hyper["beta2"].double() ** t).sqrt().float()
    new_params, new_state = {}, {"step": steps}
    for name, p in params.items():
        g = grads[name] + _per_client(hyper["weight_decay"], p) * p
        m_old, v_old = state[f"m.{name}"], state[f"v.{name}"]
        m = torch.lerp(m_old, g, _per_client(1 - hyper["beta1"], p))
        v = _per_client(hyper["beta2"], p) * v_old + _per_client(1 - hyper["beta2"], p) * g * g
        denom = v.sqrt() / _per_client(bias2_sqrt, p) + _per_client(hyper["eps"], p)
        update = _per_client(hyper["lr"] / bias1, p) * m / denom
        new_params[name] = _keep_inactive(active, p - update, p)
        new_state[f"m.{name}"] = _keep_inactive(active, m, m_old)
        new_state[f"v.{name}"] = _keep_inactive(active, v, v_old)
    return new_params, new_state
