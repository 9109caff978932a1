"""fedsim.heap.retained_heap: inside it glibc keeps large freed blocks in the heap; outside, its defaults again."""

from __future__ import annotations

import ctypes

import pytest
import torch

from fedsim.heap import _glibc, retained_heap

BIG = 96 * 2**20  # above glibc's largest mmap threshold (32 MiB), so by default always mmapped


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2() -> _MallInfo2:
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        pytest.skip("needs glibc >= 2.33 (mallinfo2)")
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2()


def _mmapped_while_alive() -> int:
    """Bytes glibc holds in mmapped blocks while one BIG tensor is alive."""
    before = _mallinfo2().hblkhd
    tensor = torch.empty(BIG // 4)
    tensor.fill_(1.0)
    during = _mallinfo2().hblkhd
    del tensor
    return during - before


def test_default_heap_mmaps_a_large_tensor() -> None:
    assert _mmapped_while_alive() >= BIG


def test_inside_a_large_tensor_comes_from_the_heap_and_its_memory_stays_after_free() -> None:
    with retained_heap() as active:
        assert active
        assert _mmapped_while_alive() == 0
        assert _mallinfo2().fordblks >= BIG  # freed, kept for the next step
    assert _mallinfo2().fordblks < BIG  # given back on leaving (malloc_trim)
    assert _mmapped_while_alive() >= BIG  # and large blocks are mmapped again


def test_nested_use_keeps_the_outer_setting_until_the_outer_block_ends() -> None:
    with retained_heap():
        with retained_heap():
            pass
        assert _mmapped_while_alive() == 0
    assert _mmapped_while_alive() >= BIG


def test_training_numbers_do_not_depend_on_it() -> None:
    def train() -> torch.Tensor:
        torch.manual_seed(0)
        model = torch.nn.Linear(2048, 4096)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(64, 2048)
        for _ in range(3):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    plain = train()
    with retained_heap():
        retained = train()
    assert torch.equal(plain, retained)
