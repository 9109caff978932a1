"""What the forkserver imports once, so that every process worker forked from it starts warm.

Process workers are forked from multiprocessing's forkserver, a process that imports this module once
(per run, or per sweep of many runs in one process) and then forks a worker in about 20 ms. Without it each
worker spent ~2.5 s in ``import torch`` and another ~1.5 s in the lazy imports of its first optimizer
(``torch._dynamo``, sympy: ~900 modules) before it could train. Nothing here computes, starts a thread pool or
touches CUDA: a worker forked from this process sets those up itself (fedsim/executor/process/worker.py).
"""

from __future__ import annotations

import torch

import fedsim.executor.process.worker  # noqa: F401  (the worker's own imports: fedsim, its client and strategy code)

torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)  # an optimizer's lazy imports, no computation
