"""CNNBatchNorm (model=cnn_bn): shapes, parameter count, initialisation, training, and executor=vmap's refusal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent.parent))
import vision_files  # noqa: E402

from fedsim.cli.run import build_server, compose  # noqa: E402
from fedsim.executor import VmapUnsupportedError  # noqa: E402
from fedsim.models import CNNBatchNorm, McMahanCNN  # noqa: E402

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)


@pytest.fixture(autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    """Tiny convolutions: a second intra-op thread on a shared 2-core machine makes them seconds slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("shape", [MNIST, CIFAR, (1, 8, 8)], ids=str)
@pytest.mark.parametrize("fc_batch_norm", [False, True])
def test_output_shape_and_batchnorm_layers(shape: tuple[int, ...], fc_batch_norm: bool) -> None:
    torch.manual_seed(0)
    model = CNNBatchNorm(shape, 7, fc_units=16, fc_batch_norm=fc_batch_norm)
    out = model(torch.randn(3, *shape))
    assert out.shape == (3, 7) and out.dtype == torch.float32
    norms = [type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert norms == ["BatchNorm2d", "BatchNorm2d"] + ["BatchNorm1d"] * fc_batch_norm
    fixed = [name for name, b in model.named_buffers() if not b.is_floating_point()]
    assert fixed and all(name.endswith("num_batches_tracked") for name in fixed)


def test_parameter_count_is_the_mnist_cnns_plus_the_batchnorm_affines() -> None:
    count = sum(p.numel() for p in CNNBatchNorm(MNIST, 10).parameters())
    assert count == 1_663_370 + 2 * (32 + 64)
    assert sum(p.numel() for p in CNNBatchNorm(MNIST, 10, fc_batch_norm=True).parameters()) == count + 2 * 512


def test_convolutions_and_dense_layers_start_as_the_mnist_cnns() -> None:
    torch.manual_seed(3)
    plain = McMahanCNN(MNIST, 10, fc_units=32)
    torch.manual_seed(3)
    with_bn = CNNBatchNorm(MNIST, 10, fc_units=32)
    ours = with_bn.state_dict()
    for name, value in plain.state_dict().items():  # McMahanCNN's second convolution is features.3, ours features.4
        assert torch.equal(ours[name.replace("features.3.", "features.4.")], value), name


def test_image_shape_checks_name_the_model() -> None:
    with pytest.raises(ValueError) as info:
        CNNBatchNorm((60,), 10)
    assert str(info.value) == (
        "model=cnn_bn needs image inputs (C, H, W) but the data gives (60,); use model=logreg or model=mlp"
    )
    with pytest.raises(ValueError, match="model=cnn_bn: images of shape"):
        CNNBatchNorm((1, 3, 3), 10)


def test_sgd_steps_reduce_loss_and_move_the_running_statistics() -> None:
    torch.manual_seed(0)
    model = CNNBatchNorm((1, 12, 12), 4, fc_units=32, fc_batch_norm=True)
    x, y = torch.randn(4, 1, 12, 12), torch.arange(4)
    losses = []
    for _ in range(3):  # plain SGD by hand: torch.optim's first optimizer imports torch._dynamo (seconds)
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.05 * p.grad
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    bn = model.features[1]
    assert not torch.equal(bn.running_mean, torch.zeros(32)) and int(bn.num_batches_tracked) == 3
    model.eval()  # evaluation normalises with the running statistics: one example is fine
    assert model(x[:1]).shape == (1, 4)


def test_vmap_refuses_it_in_one_line_before_any_work(tmp_path: Path) -> None:
    vision_files.write_mnist(tmp_path / "mnist", n_train=20, n_test=10)
    cfg = compose(
        [
            "model=cnn_bn",
            "data=mnist",
            f"data.root={tmp_path / 'mnist'}",
            "partition.num_clients=2",
            "clients_per_round=2",
            "executor=vmap",
            "num_rounds=1",
            "logger.progress=false",
        ]
    )
    with pytest.raises(VmapUnsupportedError) as info:
        build_server(cfg)  # the command line prints this message as `fedsim: error: ...`, exit status 2
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("executor=vmap cannot train BatchNorm (features.1: BatchNorm2d)")
    assert "executor=process" in message
