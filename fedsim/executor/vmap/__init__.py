"""The vmap executor: many clients trained at once on one device with ``torch.func.vmap`` (:class:`VmapExecutor` in
``executor.py``; a task unrolled before training in ``plan.py``; a chunk of clients trained in ``train.py``; functional
SGD and Adam, and :class:`VmapUnsupportedError`, in ``optim.py``; DP-SGD clients in ``dpsgd.py``)."""

from fedsim.executor.vmap.executor import VmapExecutor
from fedsim.executor.vmap.optim import VmapUnsupportedError

__all__ = ["VmapExecutor", "VmapUnsupportedError"]
