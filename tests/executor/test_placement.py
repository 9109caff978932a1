"""Worker placement: device assignment and thread budgets."""

from __future__ import annotations

import pytest

from fedsim.executor.placement import physical_cores, plan_workers, resolve_devices


def test_cpu_default_is_one_single_thread_worker_per_core() -> None:
    assert plan_workers(["cpu"], None, None, threads=1, cores=4) == [("cpu", 1)] * 4


def test_threads_reduce_the_default_worker_count() -> None:
    assert plan_workers(["cpu"], None, None, threads=2, cores=4) == [("cpu", 2)] * 2


def test_gpus_get_one_worker_each_by_default_and_round_robin() -> None:
    assert plan_workers(["cuda:0", "cuda:1"], None, None, threads=1, cores=8) == [("cuda:0", 1), ("cuda:1", 1)]
    plan = plan_workers(["cuda:0", "cuda:1"], None, 3, threads=1, cores=8)
    assert [d for d, _ in plan] == ["cuda:0", "cuda:1"] * 3


def test_explicit_worker_total_wins() -> None:
    assert len(plan_workers(["cpu"], 3, None, threads=1, cores=2)) == 3


def test_thread_oversubscription_is_refused() -> None:
    with pytest.raises(ValueError, match="executor.threads=2 x 2 workers exceeds the 2 physical cores"):
        plan_workers(["cpu"], 2, None, threads=2, cores=2)


@pytest.mark.parametrize("field", ["workers", "workers_per_device", "threads"])
def test_non_positive_counts_name_the_field(field: str) -> None:
    kwargs = {"workers": None, "workers_per_device": None, "threads": 1}
    kwargs[field] = 0
    with pytest.raises(ValueError, match=f"executor.{field} must be an integer >= 1"):
        plan_workers(["cpu"], cores=2, **kwargs)


def test_devices() -> None:
    assert resolve_devices("cpu") == ["cpu"]
    assert physical_cores() >= 1
    import torch

    if not torch.cuda.is_available():
        assert resolve_devices("auto") == ["cpu"]
        with pytest.raises(ValueError, match="no CUDA device is visible"):
            resolve_devices(["cuda:0"])
        with pytest.raises(ValueError, match="asks for cuda:0 but no CUDA"):  # a bare "cuda" is GPU 0
            resolve_devices("cuda")
    else:
        count = torch.cuda.device_count()
        assert resolve_devices("cuda") == ["cuda:0"]
        with pytest.raises(ValueError, match=f"asks for cuda:{count} but only {count} CUDA device"):
            resolve_devices([f"cuda:{count}"])
