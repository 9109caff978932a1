"""make_clients: every client as the config's factory builds it, the Hydra partial checked once, not per client."""

from __future__ import annotations

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedsim.client import Client
from fedsim.client.federation import FederatedData, make_clients
from fedsim.data.tensor_data import TensorData


class _CountingClient(Client):
    """A user's client class, as a ``client._target_`` names it; counts its own constructions."""

    built = 0

    def __init__(self, *args: object, smoothing: float = 0.0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.smoothing = smoothing
        type(self).built += 1


def _data(num_clients: int) -> FederatedData:
    empty = TensorData.__new__(TensorData)  # make_clients reads only the shares
    train = [np.arange(i, i + 3) for i in range(num_clients)]
    test = [np.arange(100 + i, 101 + i) for i in range(num_clients)]
    return FederatedData(empty, empty, train, test)


def _settings(client: Client) -> dict[str, object]:
    """What a client holds, with its optimizer factory as (callable, arguments)."""
    values = {k: v for k, v in vars(client).items() if k not in ("optimizer", "train_indices", "test_indices")}
    factory = client.optimizer
    values["optimizer"] = (factory.func, factory.args, factory.keywords)  # type: ignore[attr-defined]
    values["rows"] = (client.train_indices.tolist(), client.test_indices.tolist())
    return values


def test_hydra_factory_builds_every_client_as_calling_it_directly() -> None:
    node = OmegaConf.create(
        {
            "_target_": f"{__name__}._CountingClient",
            "_partial_": True,
            "epochs": 2,
            "batch_size": 4,
            "smoothing": 0.1,
            "optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.05},
        }
    )
    data = _data(5)
    _CountingClient.built = 0
    clients = make_clients(data, instantiate(node))
    assert _CountingClient.built == 5
    direct_factory = instantiate(node)
    direct = [
        direct_factory(client_id=i, train_indices=train, test_indices=test)
        for i, (train, test) in enumerate(zip(data.client_train, data.client_test, strict=True))
    ]
    assert [type(c) for c in clients] == [_CountingClient] * 5
    assert [_settings(c) for c in clients] == [_settings(c) for c in direct]
    assert [c.client_id for c in clients] == [0, 1, 2, 3, 4]
    assert clients[3].train_indices.tolist() == [3, 4, 5] and clients[3].smoothing == 0.1


def test_a_plain_function_factory_is_called_for_every_client() -> None:
    calls: list[int] = []

    def factory(*, client_id: int, train_indices: np.ndarray, test_indices: np.ndarray) -> Client:
        calls.append(client_id)
        return Client(client_id, train_indices, test_indices)

    clients = make_clients(_data(3), factory)
    assert calls == [0, 1, 2] and [c.client_id for c in clients] == [0, 1, 2]


def test_no_share_no_client() -> None:
    assert make_clients(_data(0), Client) == []
