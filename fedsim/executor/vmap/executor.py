"""VmapExecutor: trains many clients at once on one device with ``torch.func.vmap``.

In cross-device FL most clients are small (a few local steps of a small model); trained one after
another they leave a GPU, and even a CPU, mostly idle. This executor stacks up to ``chunk_size``
clients' parameters and trains them in one vectorised pass (see :mod:`fedsim.executor.vmap.train`),
with the built-in local loop of :meth:`fedsim.client.base.Client.fit`: same batch order, epochs, batch
sizes and optimizer (SGD with or without momentum, or Adam) as the serial executor, so results match
it up to float rounding (not bitwise: batched kernels sum in a different order). ``client=dpsgd``
clients train with DP-SGD's loop instead (Poisson batches, clipped per-example gradients, each task's
own noise; :mod:`fedsim.executor.vmap.dpsgd`), matching the serial executor the same way.

A language model that federates only its trainable parameters (LoRA adapters over a frozen ``transformers`` base,
:mod:`fedsim.models.hf_lm`) stacks only those per client: the frozen base, a tied embedding and output weight
included, stays the model's own tensors, held once and used unbatched by every client of a chunk. Its attention runs
as transformers' ``eager`` implementation while training (:func:`batchable_forward`); dropout is refused.

Chunks are formed from the round's tasks alone (grouped by optimizer kind, longest first), never from
the number of devices, so a run gives the same result on one device or several of the same kind.
With several ``devices`` each one vectorises its share of the chunks, from one thread per device.
"""

from __future__ import annotations

import copy
import logging
import traceback as tb
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch
from torch import nn

from fedsim.client.base import Client
from fedsim.client.federation import representatives
from fedsim.client.local_training import LocalTraining, overrides_on_batch
from fedsim.core.checks import integer
from fedsim.core.params import ParamLayout, checkpoints_activations, flatten
from fedsim.core.progress import progress
from fedsim.core.state_values import copy_state
from fedsim.core.threads import torch_threads
from fedsim.core.types import ClientFailure, ClientUpdate, EvalResult, EvalTask, FitTask, TaskResult
from fedsim.data.tensor_data import TensorData
from fedsim.executor.base import Executor, Workload
from fedsim.executor.eval_task import run_eval_task
from fedsim.executor.placement import resolve_devices
from fedsim.executor.vmap.dpsgd import PRIVATE_LOOP
from fedsim.executor.vmap.optim import VmapUnsupportedError
from fedsim.executor.vmap.plan import ClientPlan, plan_task
from fedsim.executor.vmap.train import EAGER_TAIL, ChunkModel, train_chunk
from fedsim.privacy.local import DPSGDClient

log = logging.getLogger("fedsim")

# Client methods that executor=vmap replaces with its own vectorised loop: a subclass must not override them.
_BUILT_IN_LOOP = ("fit", "_train", "_run_epoch", "train_step", "objective", "loss")


class VmapExecutor(Executor):
    """Trains up to ``chunk_size`` clients per vectorised pass on each of ``devices``.

    ``threads``: intra-op threads while training (default 1, like every executor: with 2 threads on a
    2-core machine that something else also uses, each parallel kernel waits for a descheduled OpenMP
    thread and a round was measured 4x slower; raise it on a dedicated machine, docs/performance.md).
    Raises :class:`VmapUnsupportedError` at :meth:`start`, before any training,
    for what it cannot vectorise: BatchNorm, random ops such as dropout, a client that overrides its
    training loop or loss, an optimizer other than SGD/Adam, a strategy client half without a
    ``functional_term``. Use ``executor=process`` for those.
    """

    def __init__(
        self, *, devices: str | Sequence[str] = "cpu", chunk_size: int | None = None, threads: int = 1
    ) -> None:
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"executor.chunk_size must be >= 1 or null (got {chunk_size})")
        integer("executor.threads", threads, 1)
        self.devices = resolve_devices(devices)
        self.chunk_size = chunk_size  # None: chosen at start() by auto_chunk_size
        self._chunk = chunk_size or 1
        self.threads = threads
        self._contexts: list[ChunkModel] = []
        self._workload: Workload | None = None
        self._specs: dict = {}  # optimizer specs by (client class, factory, config), for this run
        self._eval_model: nn.Module | None = None

    def check(self, workload: Workload) -> None:
        """What :meth:`start` refuses without building anything on a device (model, clients, client half)."""
        with torch.random.fork_rng(devices=[]):
            check_model(workload.model_factory())
        check_clients(workload.clients)
        vectorised_local(workload.local)

    def start(self, workload: Workload) -> None:
        with torch.random.fork_rng(devices=[]), progress("building the model", None, "step"):  # the caller's RNG stays
            models = [workload.model_factory().to(device) for device in self.devices]
        check_model(models[0])
        warn_unbatched_layers(models[0])
        check_clients(workload.clients)
        local = vectorised_local(workload.local)
        layout = ParamLayout.of(models[0])
        self._chunk = self.chunk_size or auto_chunk_size(
            layout.numel, self.devices[0], gpu_free_bytes=_free_bytes(self.devices)
        )
        # evaluation loads weights into its own model (as built: the serial executor's forward); training's stays
        self._eval_model = copy.deepcopy(models[0])
        self._contexts = [
            ChunkModel(batchable_forward(model), layout, _to_device(workload.train_data, model), local, f"vmap{i}")
            for i, model in enumerate(models)
        ]
        self._workload = workload
        probe_vectorisation(self._contexts[0], workload.clients)

    def fit(self, global_params: torch.Tensor, tasks: Sequence[FitTask]) -> list[TaskResult]:
        if self._workload is None:
            raise RuntimeError("VmapExecutor.fit called before start()")
        clients, model = self._workload.clients, self._contexts[0].model
        local = self._contexts[0].local
        chunks = make_chunks(
            [plan_task(clients[t.client_id], t, model, self._specs, local) for t in tasks], self._chunk
        )
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        devices = len(self._contexts)
        try:
            if devices == 1:
                results = _run_chunks(self._contexts[0], global_params, chunks)
            else:  # chunk i on device i mod D; each device's chunks one after another on its own thread
                with ThreadPoolExecutor(devices) as pool:
                    shares = [
                        pool.submit(_run_chunks, ctx, global_params, chunks[d::devices])
                        for d, ctx in enumerate(self._contexts)
                    ]
                    results = [r for share in shares for r in share.result()]
        finally:
            torch.set_num_threads(previous)
        by_id = {t.client_id: t for t in tasks}
        return [
            with_new_state(self._workload.local, by_id[r.client_id], global_params, r)
            for r in sorted(results, key=lambda r: r.client_id)
        ]

    def evaluate(self, global_params: torch.Tensor, tasks: Sequence[EvalTask]) -> list[EvalResult | ClientFailure]:
        """Score the tasks on the first device, one after another: a group shares the global model, so its
        concatenated forward pass is already one batched pass (see :mod:`fedsim.executor.eval_task`); with
        ``devices=cpu`` the scores equal the serial executor's bit for bit."""
        if self._workload is None or self._eval_model is None:
            raise RuntimeError("VmapExecutor.evaluate called before start()")
        clients, data = self._workload.clients, self._contexts[0].data
        with torch_threads(self.threads):
            return [
                run_eval_task(self._eval_model, clients, data, global_params, task, "vmap0", self._workload.local)
                for task in sorted(tasks, key=lambda t: t.client_id)
            ]

    def close(self) -> None:
        self._eval_model = None
        self._specs = {}
        self._contexts = []
        self._workload = None


def with_new_state(
    local: LocalTraining | None, task: FitTask, global_params: torch.Tensor, result: TaskResult
) -> TaskResult:
    """The update with the client's new state from the client half's :meth:`~LocalTraining.update_state`
    (as ``run_task`` does for the other executors). Without such a hook nothing under vmap can change a
    client's state (vmap refuses custom ``fit`` methods and ``end_task``), so the result keeps ``state=None``
    and the server keeps the committed state as it is."""
    if not isinstance(result, ClientUpdate) or local is None or type(local).update_state is LocalTraining.update_state:
        return result
    state = copy_state(task.state)
    local.update_state(state, task.config, global_params, result)
    return replace(result, state=copy_state(state))


def auto_chunk_size(
    numel: int, device: str, cpu_budget_bytes: int = 64 * 2**20, gpu_free_bytes: int | None = None
) -> int:
    """Clients per vectorised pass, from the chunk's parameters, gradients and optimizer state (about 16
    bytes per parameter and client).

    On a GPU: 128, or fewer if that state would take more than a quarter of the smallest device's free
    memory (``gpu_free_bytes``), at least 1. On a CPU: as many as keep it within ``cpu_budget_bytes``,
    between 8 and 128: stacked state that outgrows the caches makes every optimizer step memory-bound
    (measured on the 2NN, 200k parameters: 16–32 clients per pass were 1.7x faster than 100;
    docs/performance.md)."""
    per_client = max(16 * numel, 1)
    if device.startswith("cuda"):
        return 128 if gpu_free_bytes is None else max(1, min(128, gpu_free_bytes // 4 // per_client))
    return max(8, min(128, cpu_budget_bytes // per_client))


def _free_bytes(devices: Sequence[str]) -> int | None:
    """The smallest free memory among the CUDA ``devices``, or ``None`` when none is a GPU."""
    gpus = [torch.device(d) for d in devices if d.startswith("cuda")]
    return min(torch.cuda.mem_get_info(d)[0] for d in gpus) if gpus else None


def make_chunks(plans: Sequence[ClientPlan], chunk_size: int) -> list[list[ClientPlan]]:
    """Group plans by client class and optimizer kind, order each group longest first, then widest batch
    first (so clients in a chunk need similar step counts and little padding: DP-SGD's Poisson batches grow
    with the client), and cut it into chunks of ``chunk_size``."""
    groups: dict[tuple, list[ClientPlan]] = {}
    for plan in plans:
        key = (type(plan.client).__qualname__, type(plan.client).__module__, plan.optimizer.group_key)
        groups.setdefault(key, []).append(plan)
    chunks: list[list[ClientPlan]] = []
    for key in sorted(groups, key=repr):
        ordered = sorted(groups[key], key=lambda p: (-p.num_steps, -p.rows.shape[1], p.task.client_id))
        chunks.extend(ordered[i : i + chunk_size] for i in range(0, len(ordered), chunk_size))
    return chunks


def _run_chunks(ctx: ChunkModel, global_params: torch.Tensor, chunks: Sequence[list[ClientPlan]]) -> list[TaskResult]:
    """Train ``chunks`` one after another on one device (its model is not shared with another thread)."""
    return [result for chunk in chunks for result in _run_chunk(ctx, global_params, chunk)]


def _run_chunk(ctx: ChunkModel, global_params: torch.Tensor, chunk: list[ClientPlan]) -> list[TaskResult]:
    """Train one chunk; if it raises, every client of the chunk fails with the traceback."""
    try:
        return list(train_chunk(ctx, global_params, chunk))
    except Exception as error:  # noqa: BLE001 - client code may raise anything; it becomes data
        ids = [p.task.client_id for p in chunk]
        text = tb.format_exc()
        return [
            ClientFailure(
                client_id=p.task.client_id,
                round_num=p.task.round_num,
                worker=ctx.worker,
                error=f"{type(error).__name__}: {error} (in a vmap chunk of clients {ids})",
                traceback=text,
            )
            for p in chunk
        ]


def check_model(model: nn.Module) -> None:
    """Refuse BatchNorm: its batch statistics would mix padded examples in and its running statistics cannot be
    vectorised per client. Refuse transformers' gradient checkpointing (``model.gradient_checkpointing``). Refuse
    dropout in a model that federates only its trainable parameters (a language model, :mod:`fedsim.models.hf_lm`;
    vmap has no per-client random numbers), naming its keys; other models' random ops are caught by
    :func:`probe_vectorisation`. Such a model's frozen base is not vectorised: only its federated entries (the
    adapters) are stacked per client, see :mod:`fedsim.executor.vmap.train`."""
    if checkpoints_activations(model):
        raise VmapUnsupportedError(
            "executor=vmap cannot run gradient checkpointing (torch.func transforms do not recompute activations): "
            "set model.gradient_checkpointing=false, or use executor=process"
        )
    if getattr(model, "federates_trainable_only", False):
        for name, module in model.named_modules():
            if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
                raise VmapUnsupportedError(
                    f"executor=vmap cannot vectorise dropout ({name}: p={module.p}; vmap has no per-client random "
                    "numbers): set adapter.dropout=0 and model.dropout=0 (a model from model.path keeps its "
                    "config's dropouts), or use executor=process"
                )
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise VmapUnsupportedError(
                f"executor=vmap cannot train BatchNorm ({name or 'the model'}: {type(module).__name__}); "
                "use GroupNorm (e.g. model=resnet18 is GroupNorm) or executor=process"
            )


def warn_unbatched_layers(model: nn.Module) -> None:
    """Say once, at start-up, that recurrent layers gain nothing from vmap: PyTorch has no batched kernel for them
    under ``torch.func.vmap`` and loops over the chunk's clients (the results are still right)."""
    recurrent = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.RNNBase)})
    if recurrent:
        log.warning(
            "executor=vmap trains %s one client at a time (PyTorch has no batched kernel for it under "
            "torch.func.vmap): expect no speed-up over executor=serial; executor=process is faster for this "
            "model",
            ", ".join(recurrent),
        )


def check_clients(clients: Sequence[Client]) -> None:
    """Refuse client classes that replace the built-in training loop or loss (DP-SGD's, for a
    :class:`~fedsim.privacy.local.DPSGDClient`: :mod:`fedsim.executor.vmap.dpsgd` vectorises it)."""
    for client in representatives(clients):
        if getattr(client, "autocast", None) is not None:
            raise VmapUnsupportedError(
                f"executor=vmap cannot apply client.autocast={client.autocast} (its vectorised loop calls no "
                "Client.objective); set client.autocast=null, or use executor=process"
            )
    for cls in {type(c) for c in representatives(clients)}:
        private = issubclass(cls, DPSGDClient)
        reference = DPSGDClient if private else Client
        for method in _BUILT_IN_LOOP + (PRIVATE_LOOP if private else ()):
            if getattr(cls, method) is not getattr(reference, method):
                raise VmapUnsupportedError(
                    f"executor=vmap cannot run {cls.__qualname__}.{method} (a custom {method}): it trains with its own "
                    "vectorised loop; override per_example_loss instead, or use executor=process"
                )


def vectorised_local(local: LocalTraining | None) -> LocalTraining | None:
    """The strategy's client half if it has a ``functional_term``, ``None`` if it changes nothing; refuse a
    client half that changes training but has no vectorised form."""
    if local is not None and type(local).end_task is not LocalTraining.end_task:
        raise VmapUnsupportedError(
            f"executor=vmap cannot run the strategy's client half {type(local).__name__}: it keeps client state "
            f"that depends on the trained model ({type(local).__name__}.end_task), which has no vectorised form "
            "(write it with update_state instead if you can); use executor=process"
        )
    if overrides_on_batch(local):
        raise VmapUnsupportedError(
            f"executor=vmap cannot run the strategy's client half {type(local).__name__}: it steps a second model on "
            f"every batch ({type(local).__name__}.on_batch), which has no vectorised form; use executor=process"
        )
    for hook in ("before_training", "after_training"):
        if local is not None and getattr(type(local), hook) is not getattr(LocalTraining, hook):
            raise VmapUnsupportedError(
                f"executor=vmap cannot run the strategy's client half {type(local).__name__}: it trains or measures "
                f"the model outside the local epochs ({type(local).__name__}.{hook}); use executor=process"
            )
    if local is None or type(local).functional_term is not LocalTraining.functional_term:
        return local
    hooks = ("begin", "begin_task", "loss_term", "before_step")
    changes_training = any(getattr(type(local), hook) is not getattr(LocalTraining, hook) for hook in hooks)
    if not changes_training:
        return None  # adds nothing
    raise VmapUnsupportedError(
        f"executor=vmap cannot run the strategy's client half {type(local).__name__}: it has no functional_term() "
        "(see LocalTraining.functional_term); use executor=process"
    )


def probe_vectorisation(ctx: ChunkModel, clients: Sequence[Client]) -> None:
    """Run one tiny vectorised step (a few copies of the first client with data) before any training, so that
    what vmap cannot do (random ops such as dropout, in-place tricks) fails at start-up with a clear message."""
    client = next((c for c in clients if c.num_train > 0), None)
    if client is None:
        return
    probe = replace_indices(client, client.train_indices[:2])
    plans = [
        plan_task(probe, FitTask(client_id=probe.client_id, round_num=-1, seed=seed), ctx.model)
        for seed in range(EAGER_TAIL + 1)
    ]
    plans = [replace(p, rows=p.rows[:1], sizes=p.sizes[:1], epochs=1, steps_per_epoch=1) for p in plans]
    global_params = flatten(ctx.model)
    try:
        with torch.random.fork_rng(devices=[]):
            train_chunk(ctx, global_params, plans)
    except RuntimeError as error:
        reason = (
            "the model draws random numbers (e.g. dropout)"
            if "randomness" in str(error)
            else f"{error}".splitlines()[0]
        )
        raise VmapUnsupportedError(
            f"executor=vmap cannot vectorise this model: {reason}; use executor=process"
        ) from error


def replace_indices(client: Client, indices: object) -> Client:
    """A shallow copy of ``client`` that trains on other indices (for the start-up probe)."""
    probe = object.__new__(type(client))
    probe.__dict__.update(client.__dict__)
    probe.train_indices = torch.as_tensor(indices).numpy()
    return probe


def batchable_forward(model: nn.Module) -> nn.Module:
    """``model`` with the forward ``torch.func.vmap`` batches: a ``transformers`` model's attention as plain matrix
    products and softmax (``attn_implementation="eager"``; PyTorch has no batching rule for the CPU kernel of
    ``scaled_dot_product_attention`` and would loop over the chunk's clients). The same function up to float
    rounding."""
    for module in model.modules():
        setter: object = getattr(module, "set_attn_implementation", None)  # transformers' PreTrainedModel (PEFT's too)
        if callable(setter):
            setter("eager")
            break
    return model


def _to_device(data: TensorData, model: nn.Module) -> TensorData:
    """The training data on the model's device (a GPU gets one copy per run; CPU data is used as is)."""
    device = next(model.parameters()).device
    return data if device.type == "cpu" else replace(data, x=data.x.to(device), y=data.y.to(device))
