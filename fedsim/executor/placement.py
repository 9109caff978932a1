"""Where workers run: which device each one gets and how many CPU threads it may use."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from fedsim.core.checks import integer


def physical_cores() -> int:
    """Physical cores this process may run on (SMT siblings counted once); falls back to the CPU count."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(
                ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
            )
        except OSError:
            return len(cpus)
    return max(len(cores), 1)


def resolve_devices(devices: str | Sequence[str]) -> list[str]:
    """``"auto"`` → every visible GPU, else ``["cpu"]``; ``"cpu"`` or ``"cuda:0"`` → one; a list as given.
    A bare ``"cuda"`` means ``"cuda:0"`` (a worker pins an indexed device)."""
    if isinstance(devices, str):
        if devices == "auto":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            return [f"cuda:{i}" for i in range(count)] or ["cpu"]
        devices = [devices]
    resolved = [str(torch.device(d)) for d in devices]
    resolved = ["cuda:0" if name == "cuda" else name for name in resolved]
    if not resolved:
        raise ValueError("executor.devices must name at least one device (or be 'auto')")
    for name in resolved:
        if name.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(
                f"executor.devices asks for {name} but no CUDA device is visible; use executor.devices=cpu or auto"
            )
        if name.startswith("cuda") and torch.device(name).index >= torch.cuda.device_count():
            raise ValueError(
                f"executor.devices asks for {name} but only {torch.cuda.device_count()} CUDA device(s) are "
                "visible (cuda:0 onwards); use executor.devices=auto"
            )
    return resolved


def plan_workers(
    devices: Sequence[str], workers: int | None, workers_per_device: int | None, threads: int, cores: int
) -> list[tuple[str, int]]:
    """(device, intra-op threads) of every worker, assigned round-robin over ``devices``.

    Default count: ``cores // threads`` workers when all devices are CPU, one per GPU otherwise.
    Every worker trains with the same ``threads``: CPU kernels round differently with different thread
    counts, so a fixed thread count is what keeps results bitwise identical for any number of workers.
    """
    for name, value in (("workers", workers), ("workers_per_device", workers_per_device), ("threads", threads)):
        if value is not None:
            integer(f"executor.{name}", value, 1)
    if workers is None:
        all_cpu = all(d == "cpu" for d in devices)
        per_device = workers_per_device or (max(1, cores // threads) if all_cpu else 1)
        workers = per_device * len(devices)
    if workers * threads > cores and threads > 1:
        raise ValueError(
            f"executor.threads={threads} x {workers} workers exceeds the {cores} physical cores; "
            f"lower executor.threads or executor.workers"
        )
    return [(devices[i % len(devices)], threads) for i in range(workers)]
