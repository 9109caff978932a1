"""FedPer: known answers of its rule, and a run from the command line with ``strategy._target_=`` alone on model=cnn."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent))
import vision_files  # noqa: E402
from cli_runner import run_cli  # noqa: E402

from fedsim.client.state import ClientStateStore  # noqa: E402
from fedsim.core.checkpoint import load_latest  # noqa: E402
from fedsim.core.params import ParamLayout, flatten  # noqa: E402
from fedsim.core.seeding import init_seed  # noqa: E402
from fedsim.core.types import ClientUpdate  # noqa: E402
from fedsim.models import McMahanCNN  # noqa: E402
from fedsim.strategy import FedPer  # noqa: E402
from fedsim.strategy.context import RunContext  # noqa: E402
from fedsim.strategy.fedper import STATE_KEY, PersonalLayers, last_layer_pattern  # noqa: E402


def _context(model: torch.nn.Module) -> RunContext:
    return RunContext(
        layout=ParamLayout.of(model), num_clients=3, num_examples=(1, 3, 4), clients_per_round=2, num_rounds=1, seed=0
    )


def test_base_layers_are_averaged_and_personal_layers_keep_the_global_values() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 1), torch.nn.Linear(1, 1)
    )  # entries: 0.weight (2), 0.bias, 1.weight, 1.bias
    strategy = FedPer()
    strategy.setup(_context(model))
    assert strategy.names == ("1.weight", "1.bias") and last_layer_pattern(ParamLayout.of(model).names) == r"^1\."
    global_params = torch.tensor([9.0, 9.0, 9.0, 7.0, 7.0])
    updates = [
        ClientUpdate(0, 1, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), 1),
        ClientUpdate(2, 1, torch.tensor([5.0, 6.0, 7.0, 8.0, 9.0]), 3),
    ]
    new = strategy.aggregate(1, global_params, updates)
    assert torch.equal(new, torch.tensor([4.0, 5.0, 6.0, 7.0, 7.0]))  # (1·1 + 3·5) / 4 = 4 ... ; the head: unchanged
    assert strategy.round_metrics(1) == {"personal_fraction": 0.4}


def test_the_client_half_restores_and_keeps_its_own_head() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.Linear(1, 1))
    half, state = PersonalLayers(("1.weight", "1.bias")), {}
    half.begin_task(model, {}, state)  # first round: the global head stays
    with torch.no_grad():
        model[1].weight.fill_(3.0)
    half.end_task(model, {}, state)
    assert set(state[STATE_KEY]) == {"1.weight", "1.bias"} and float(state[STATE_KEY]["1.weight"]) == 3.0
    with torch.no_grad():
        model[1].weight.fill_(-1.0)  # next round's global head
        model[0].weight.fill_(0.5)
    half.begin_task(model, {}, state)
    assert float(model[1].weight.detach()) == 3.0 and torch.all(model[0].weight == 0.5)  # own head, global base


def test_fedper_runs_on_the_cnn_from_the_command_line(tmp_path: Path) -> None:
    root = tmp_path / "mnist"
    vision_files.write_mnist(root, n_train=64, n_test=32)
    run_dir = tmp_path / "run"
    done = run_cli(
        [
            "model=cnn",
            "data=mnist",
            f"data.root={root}",
            "partition.num_clients=4",
            "clients_per_round=2",
            "num_rounds=3",
            "strategy._target_=fedsim.strategy.FedPer",
            "logger.progress=false",
            f"hydra.run.dir={run_dir}",
        ]
    )
    assert done.returncode == 0, done.stderr
    final = load_latest(run_dir / "checkpoints")[1]["params"]
    torch.manual_seed(init_seed(0))  # the run's initial global model (seed=0)
    initial = flatten(McMahanCNN(input_shape=(1, 28, 28), num_classes=10))
    layout = ParamLayout.of(McMahanCNN(input_shape=(1, 28, 28), num_classes=10))
    head = layout.mask(layout.matching(r"^classifier\.3\."))
    assert torch.equal(final[head], initial[head]), "the global head never changes: clients keep theirs"
    assert not torch.equal(final[~head], initial[~head]), "the base layers are federated"
    store = ClientStateStore("disk", run_dir / "checkpoints" / "client_state")
    store.rewind(3)
    heads = [store.get(cid)[STATE_KEY]["classifier.3.weight"] for cid in store.clients()]
    assert len(heads) >= 2 and not torch.equal(heads[0], heads[1]), "each client keeps a head of its own"


def test_vmap_refuses_fedper_in_one_line_before_any_work(tmp_path: Path) -> None:
    done = run_cli(
        ["model=mlp", "strategy=fedper", "executor=vmap", "num_rounds=2", f"hydra.run.dir={tmp_path / 'run'}"]
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedsim: error: executor=vmap cannot run"), done.stderr
    assert "PersonalLayers" in lines[0] and "executor=process" in lines[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()
