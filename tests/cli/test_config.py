"""Configuration: every option of every conf group composes and builds; the command line runs, fails
with one clear line on bad input, takes user classes by ``_target_`` and leaves readable logs."""

from __future__ import annotations

import functools
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cli_runner import run_cli
from composed import composed
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from fedsim.core.params import ParamLayout
from fedsim.strategy.context import RunContext

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the vision_files helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))  # tests/data: writers of the other formats

import hf_files  # noqa: E402
import leaf_files  # noqa: E402
import llm_files  # noqa: E402
import tff_files  # noqa: E402
import vision_files  # noqa: E402

from fedsim.cli.config import ConfigError, validate  # noqa: E402
from fedsim.cli.run import CONFIG_DIR, build_server, compose, run_config  # noqa: E402
from fedsim.client.base import Client  # noqa: E402
from fedsim.client.evaluation import ClientEvaluation  # noqa: E402
from fedsim.comm import Compression  # noqa: E402
from fedsim.core.types import ClientUpdate, FitTask  # noqa: E402
from fedsim.data.tensor_data import DataSplit, TensorData  # noqa: E402
from fedsim.executor import Executor, SerialExecutor, Workload  # noqa: E402
from fedsim.models import LogisticRegression  # noqa: E402
from fedsim.models.hf_lm import hf_causal_lm  # noqa: E402
from fedsim.observe.run_logger import RunLogger  # noqa: E402
from fedsim.observe.tensorboard_log import tensorboard_tag  # noqa: E402
from fedsim.server.server import RunResult, Server  # noqa: E402
from fedsim.sim.clock import SyncClock  # noqa: E402
from fedsim.strategy import Strategy  # noqa: E402
from fedsim.strategy.root_data import root_trainer  # noqa: E402

CONF = Path(CONFIG_DIR)
USER_PKG = Path(__file__).resolve().parents[1] / "user_pkg"
GROUPS = (
    "data",
    "partition",
    "model",
    "adapter",
    "client",
    "strategy",
    "executor",
    "logger",
    "tracker",
    "evaluate_clients",
    "clock",
    "compression",
    "dp",
    "attack",
    "secagg",
    "experiment",
)
SYNTHETIC = "fedsim.data.synthetic.synthetic"
GENERATED = (SYNTHETIC, "fedsim.data.synthetic_text.synthetic_text")  # data made from the seed: no file

# --- tiny real-format files for the torchvision datasets --------------------------------------------

Writer = Callable[[Path, int, int, DictConfig], None]
VISION_WRITERS: dict[str, Writer] = {
    "fedsim.data.vision.mnist": lambda root, n, m, cfg: vision_files.write_mnist(root, n, m),
    "fedsim.data.vision.fashion_mnist": lambda root, n, m, cfg: vision_files.write_mnist(
        root, n, m, folder="FashionMNIST"
    ),
    "fedsim.data.vision.emnist": lambda root, n, m, cfg: vision_files.write_emnist(
        root, cfg.data.get("split", "balanced"), n, m
    ),
    "fedsim.data.vision.cifar10": lambda root, n, m, cfg: vision_files.write_cifar10(root, n, m),
}


def _write_npz(root: Path, n_train: int, n_test: int) -> list[str]:
    """An ``.npz`` of ``n_train`` + ``n_test`` rows (10 classes, 4 owners) for ``data=npz``."""
    rng = np.random.default_rng(0)
    path = root / "arrays.npz"
    np.savez(
        path,
        x_train=rng.standard_normal((n_train, 6)).astype(np.float32),
        y_train=np.arange(n_train) % 10,
        x_test=rng.standard_normal((n_test, 6)).astype(np.float32),
        y_test=np.arange(n_test) % 10,
        client_ids=np.arange(n_train) % 4,
    )
    return [f"data.path={path}"]


def _leaf(root: Path, name: str, n_train: int, n_test: int) -> list[str]:
    """A LEAF folder of 12 users (the reference experiments sample 10 per round)."""
    leaf_files.write_leaf(root, name, n_train, n_test, users=12)
    return [f"data.root={root}"]


def _write_hf(root: Path, n_train: int, n_test: int, cfg: DictConfig) -> list[str]:
    """The Hugging Face copy that ``cfg.data``'s columns describe: FEMNIST-like, Shakespeare-like or generic."""
    writers = {"image": hf_files.write_femnist_hf, "x": hf_files.write_shakespeare_hf}
    feature = "" if OmegaConf.is_missing(cfg.data, "feature_column") else cfg.data.feature_column
    return writers.get(feature, hf_files.write_hf)(root, n_train, n_test)


# other data options: writer(root, n_train, n_test, cfg) -> the overrides that point the option at the files
DATA_WRITERS: dict[str, Callable[[Path, int, int, DictConfig], list[str]]] = {
    "fedsim.data.arrays.npz": lambda root, n, m, cfg: _write_npz(root, n, m),
    "fedsim.data.leaf.femnist": lambda root, n, m, cfg: _leaf(root, "femnist", n, m),
    "fedsim.data.leaf.shakespeare": lambda root, n, m, cfg: _leaf(root, "shakespeare", n, m),
    "fedsim.data.leaf.sent140": lambda root, n, m, cfg: leaf_files.write_sent140(root, n, m),
    "fedsim.data.leaf.celeba": lambda root, n, m, cfg: leaf_files.write_celeba(root, n, m),
    "fedsim.data.cifar100.cifar100": lambda root, n, m, cfg: tff_files.write_cifar100(root, n, m),
    "fedsim.data.tff.femnist_tff": lambda root, n, m, cfg: tff_files.write_femnist_tff(
        root, n, m, only_digits=bool(cfg.data.get("only_digits")), writers=12
    ),
    "fedsim.data.hf.hf": _write_hf,
    "fedsim.data.instructions.jsonl_instructions": lambda root, n, m, cfg: llm_files.write_instructions(root, n, m),
    "fedsim.data.instructions.jsonl_classification": lambda root, n, m, cfg: llm_files.write_classification(root, n, m),
    "fedsim.data.text_corpus.text_corpus": lambda root, n, m, cfg: llm_files.write_corpus(root),
    "fedsim.data.text_corpus.shakespeare_lm": lambda root, n, m, cfg: _leaf(root, "shakespeare", n, m),
}
TOKEN_LABELS = {  # options whose labels are a token per position ([N, T]): their row counts come from the windows
    "fedsim.data.instructions.jsonl_instructions": False,
    "fedsim.data.text_corpus.text_corpus": True,
    "fedsim.data.text_corpus.shakespeare_lm": True,
    "fedsim.data.synthetic_text.synthetic_text": True,
}


def _with_data(overrides: list[str], root: Path, n_train: int, n_test: int) -> list[str] | None:
    """``overrides`` plus what makes their dataset loadable here (tiny files under ``root``);
    ``None`` when the dataset is neither synthetic nor one we can write."""
    cfg = composed(overrides)
    target = cfg.data._target_
    if target in GENERATED:
        return list(overrides)
    if target in DATA_WRITERS:
        return [*overrides, *DATA_WRITERS[target](root, n_train, n_test, cfg)]
    if target not in VISION_WRITERS:
        return None
    VISION_WRITERS[target](root, n_train, n_test, cfg)
    extra = [f"data.root={root}"]
    if "verify_checksums" in cfg.data:
        extra.append("data.verify_checksums=false")  # hand-made files cannot match the official md5s
    return [*overrides, *extra]


DataFiles = Callable[[list[str], int, int], "list[str] | None"]


@pytest.fixture(scope="module")
def data_files(tmp_path_factory: pytest.TempPathFactory) -> DataFiles:
    """:func:`_with_data` for the module: the files of each (overrides, sizes) written once, in a folder of their
    own, so that the tests of one option read the same files through the same composition."""
    made: dict[tuple[tuple[str, ...], int, int], list[str] | None] = {}

    def files(overrides: list[str], n_train: int, n_test: int) -> list[str] | None:
        key = (tuple(overrides), n_train, n_test)
        if key not in made:
            made[key] = _with_data(list(overrides), tmp_path_factory.mktemp("data"), n_train, n_test)
        return None if made[key] is None else list(made[key])

    return files


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


ALL_OPTIONS = [(g, o) for g in GROUPS for o in _options(g)]


def test_conf_has_exactly_the_documented_groups_each_with_options() -> None:
    found = sorted(p.name for p in CONF.iterdir() if p.is_dir())
    assert found == sorted(GROUPS)
    assert all(_options(g) for g in GROUPS)
    assert (CONF / "config.yaml").is_file()


# --- (a) every option of every group composes and instantiates ----------------------------------------


def _check_data(cfg: DictConfig, option: str) -> None:
    split = instantiate(cfg.data)
    assert isinstance(split, DataSplit)
    train, test = split.train, split.test
    assert len(train) > 0 and len(test) > 0
    assert train.input_shape == test.input_shape and train.num_classes == test.num_classes >= 2
    assert train.x.dtype in (torch.float32, torch.int64) and train.y.dtype == torch.int64  # int64: token ids
    scored = train.y[train.y != -100] if train.y.ndim == 2 else train.y  # token labels: -100 where no loss is taken
    assert train.y.ndim in (1, 2) and len(scored) > 0
    assert int(scored.min()) >= 0 and int(scored.max()) < train.num_classes
    if TOKEN_LABELS.get(cfg.data._target_):  # windows of the written text: as many as the text makes
        assert train.y.ndim == 2 and train.x.shape == train.y.shape
    elif cfg.data._target_ != SYNTHETIC:
        rows = len(train) - (int(split.local_test.sum()) if split.local_test is not None else 0)
        assert rows == 60 and len(test) == 20  # the tiny files, not some other copy


def _check_partition(cfg: DictConfig, option: str) -> None:
    partition = instantiate(cfg.partition)
    labels, groups = np.arange(20_000) % 10, np.arange(20_000) % 7
    parts = partition(labels, seed=0, groups=groups)
    assert len(parts) >= 2
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(20_000))  # each example exactly once
    again = partition(labels, seed=0, groups=groups)  # pure in seed
    assert len(again) == len(parts) and all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def _check_model(cfg: DictConfig, option: str) -> None:
    factory = instantiate(cfg.model)
    inputs = [
        torch.zeros(2, 1, 28, 28),
        torch.zeros(2, 3, 32, 32),
        torch.zeros(2, 60),
        torch.ones(2, 25, dtype=torch.int64),
    ]
    for x in inputs:  # image, flat features, or token ids (text models)
        try:
            out = factory(input_shape=tuple(x.shape[1:]), num_classes=10)(x)
        except (ValueError, RuntimeError):
            continue  # e.g. a CNN asked for a flat input, a text model given floats
        assert out.shape in ((2, 10), (2, *x.shape[1:], 10))  # a class score per example, or per position (an LM)
        return
    pytest.fail(f"model={option} builds for none of the usual inputs")


def _tiny_data() -> TensorData:
    gen = torch.Generator().manual_seed(0)
    return TensorData(torch.randn(30, 6, generator=gen), torch.arange(30) % 3, 3)


def _check_client(cfg: DictConfig, option: str) -> None:
    factory = instantiate(cfg.client)
    client = factory(client_id=3, train_indices=np.arange(20), test_indices=np.arange(20, 30))
    assert isinstance(client, Client) and client.client_id == 3 and client.num_train == 20
    model = LogisticRegression((6,), 3)
    assert isinstance(client.optimizer(model.parameters()), get_class(cfg.client.optimizer._target_))
    update = client.fit(model, _tiny_data(), generator=torch.Generator().manual_seed(0))
    assert len(update.epoch_losses) == cfg.client.epochs and math.isfinite(update.metrics["train_loss"])


def _check_strategy(cfg: DictConfig, option: str) -> None:
    strategy = instantiate(cfg.strategy)
    assert isinstance(strategy, Strategy)
    # 9 values: 2 + 1, BatchNorm's weight, bias, running mean and variance (FedBN needs one), then 1 + 1
    model = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.BatchNorm1d(1), torch.nn.Linear(1, 1))
    if option == "fedsa_lora":  # the same 9 values, named as LoRA adapters (FedSA-LoRA keeps every lora_B personal)
        model = torch.nn.ModuleDict({"lm": torch.nn.ModuleDict({"lora_A": model[:2], "lora_B": model[2]})})
    # a root dataset for FLTrust: 200 two-feature rows of one class over ten clients of 20
    rows = TensorData(
        torch.randn(200, 2, generator=torch.Generator().manual_seed(0)), torch.zeros(200, dtype=torch.long), 1
    )
    clients = [Client(i, np.arange(20 * i, 20 * i + 20)) for i in range(10)]
    strategy.setup(
        RunContext(
            layout=ParamLayout.of(model),
            num_clients=10,
            num_examples=tuple(range(1, 11)),
            clients_per_round=10,
            num_rounds=2,
            seed=0,
            root_trainer=functools.partial(root_trainer, model=model, clients=clients, data=rows, seed=0),
        )
    )
    # ten clients: enough for the robust rules (Krum needs 2f + 3; trimmed_mean's beta=0.1 must trim one)
    # what Client.fit reports (SCAFFOLD, FedNova need them), and q-FFL's client half
    metrics = {"local_steps": 2.0, "lr": 0.1, "train_loss": 0.5, "qffl_start_loss": 0.5}
    updates = [ClientUpdate(i, 1, torch.linspace(-1, 1, 9) * i, i + 1, metrics=metrics) for i in range(10)]
    if getattr(
        strategy, "asynchronous", False
    ):  # FedBuff, BASGD: a server step from a buffer of deltas, staleness, clients
        new = strategy.step(torch.full((9,), 0.5), [u.params for u in updates], list(range(10)), list(range(10)))
        assert new.shape == (9,) and torch.isfinite(new).all()
        return
    new = strategy.aggregate(1, torch.full((9,), 0.5), updates)
    assert new.shape == (9,) and new.dtype == torch.float32 and torch.isfinite(new).all()
    strategy.load_state_dict(strategy.state_dict())  # checkpoints round-trip
    assert torch.isfinite(strategy.aggregate(2, new, updates)).all()


def _check_executor(cfg: DictConfig, option: str) -> None:
    executor = instantiate(cfg.executor)
    assert isinstance(executor, Executor)
    if isinstance(executor, SerialExecutor):  # the others start worker processes: tests/executor covers them
        clients = [Client(0, np.arange(20), batch_size=5)]
        executor.start(Workload(lambda: LogisticRegression((6,), 3), clients, _tiny_data()))
        [result] = executor.fit(torch.zeros(21), [FitTask(client_id=0, round_num=1, seed=1)])
        assert isinstance(result, ClientUpdate) and result.params.shape == (21,)
    executor.close()


def _check_logger(cfg: DictConfig, option: str) -> None:
    assert {"tensorboard", "progress"} <= set(cfg.logger)
    RunLogger(None, tensorboard=cfg.logger.tensorboard, progress=cfg.logger.progress).close()


def _check_evaluate_clients(cfg: DictConfig, option: str) -> None:
    section = cfg.evaluate_clients
    plan = ClientEvaluation(section.who, section.size, section.every)
    assert (
        plan.who == option
        and len(plan.clients([1, 3], 200, seed=0)) == {"sampled": 2, "all": 200, "cohort": section.size}[option]
    )


def _check_tracker(cfg: DictConfig, option: str) -> None:
    from fedsim.observe.trackers import TrackedLogger, make_logger

    logger = make_logger(cfg, None, tensorboard=False, progress=False)
    assert isinstance(logger, TrackedLogger) == (option != "none")
    logger.close()


def _check_clock(cfg: DictConfig, option: str) -> None:
    if cfg.clock._target_ is None:
        return
    clock = instantiate(cfg.clock)(num_clients=20, seed=0)  # the example trace has 20 clients
    assert isinstance(clock, SyncClock) and clock.profiles.num_clients == 20 and clock.now_s == 0.0


def _check_compression(cfg: DictConfig, option: str) -> None:
    from fedsim.cli.run import build_compression

    compression = build_compression(cfg)
    assert isinstance(compression, Compression) and compression.lossless == (option == "none")


def _check_dp(cfg: DictConfig, option: str) -> None:
    from fedsim.cli.run import build_privacy

    dp = build_privacy(cfg)
    assert (dp is None) == (option == "none")
    if dp is not None:
        assert (
            dp.adaptive == (option == "adaptive") and dp.update_multiplier(cfg.clients_per_round) >= dp.noise_multiplier
        )


def _check_attack(cfg: DictConfig, option: str) -> None:
    from fedsim.attacks import Attack
    from fedsim.cli.run import build_attack

    attack = build_attack(cfg)
    assert (attack is None) == (option == "none")
    if attack is not None:
        assert isinstance(attack, Attack) and len(attack.malicious(0, 1, 30)) == 6  # 20 % of 30 by default


def _check_secagg(cfg: DictConfig, option: str) -> None:
    from fedsim.cli.secagg_option import build_secagg
    from fedsim.secagg import SecureAggregation

    stages = build_secagg(cfg, instantiate(cfg.strategy), instantiate)
    assert [type(s) for s in stages] == ([] if option == "none" else [SecureAggregation])
    if stages:
        assert stages[0].protocol == option and stages[0].seed == cfg.seed and stages[0].name == "secagg"


EXAMPLE_TRACE = Path(__file__).resolve().parents[2] / "experiments" / "sim" / "example_trace.csv"


def _check_adapter(cfg: DictConfig, option: str) -> None:
    """``none`` builds nothing; an adapter on a tiny causal LM leaves fewer weights trainable, and exactly those are
    federated."""
    if cfg.adapter.get("_target_") is None:
        return
    model = instantiate(cfg.adapter).apply(
        hf_causal_lm(input_shape=(8,), num_classes=20, hidden_size=16, num_layers=1, num_heads=2, seed=0)
    )
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert 0 < len(trainable) < len(list(model.parameters()))
    assert ParamLayout.of(model).names == tuple(trainable)


CHECKS = {
    "data": _check_data,
    "partition": _check_partition,
    "model": _check_model,
    "adapter": _check_adapter,
    "client": _check_client,
    "strategy": _check_strategy,
    "executor": _check_executor,
    "logger": _check_logger,
    "tracker": _check_tracker,
    "evaluate_clients": _check_evaluate_clients,
    "clock": _check_clock,
    "compression": _check_compression,
    "dp": _check_dp,
    "attack": _check_attack,
    "secagg": _check_secagg,
}


@pytest.mark.parametrize(("group", "option"), [p for p in ALL_OPTIONS if p[0] != "experiment"])
def test_every_group_option_composes_and_instantiates(group: str, option: str, data_files: DataFiles) -> None:
    overrides = [f"{group}={option}"]
    if group == "data":
        overrides = data_files(overrides, 60, 20) or pytest.fail(f"no tiny files for data={option}")
    if group == "clock" and option == "trace":
        overrides.append(f"clock.path={EXAMPLE_TRACE}")
    if group == "model" and option == "hf_seq_cls":
        overrides.append("model.vocab_size=30")  # a randomly initialised classifier needs its tokenizer's vocabulary
    cfg = composed(overrides)
    assert cfg[group] is not None
    CHECKS[group](cfg, option)


SHRUNK = {"million_devices": ["data.num_devices=1000"]}  # built here smaller: the preset's data is 2.3 GiB


@pytest.mark.parametrize("option", _options("experiment"))
def test_every_experiment_composes_and_builds(option: str, data_files: DataFiles) -> None:
    base = composed([f"experiment={option}"])
    overrides = data_files([f"experiment={option}", *SHRUNK.get(option, [])], 600, 60)
    if overrides is None:
        return  # composes; its dataset cannot be made here
    cfg = composed(overrides)
    server = build_server(cfg)
    assert isinstance(server, Server)
    assert server.num_rounds == base.num_rounds and server.parts.schedule.clients_per_round == base.clients_per_round
    assert all(c.epochs == cfg.client.epochs and c.batch_size == cfg.client.batch_size for c in server.clients)
    assert type(server.strategy) is type(instantiate(cfg.strategy))  # (a _target_ may be a factory, e.g. FedAvgM)


def test_the_million_devices_preset_is_the_recipe_of_the_performance_page() -> None:
    """experiment=million_devices composes to the configuration of docs/performance.md's command line (composed, not
    run: its data is 2.3 GiB), and passes the checks a run makes before any work."""
    page = (Path(CONFIG_DIR).parent / "docs" / "performance").with_suffix(".md").read_text(encoding="utf-8")
    recipe = re.search(r"\*\*The recipe\*\*.*?`python -m fedsim\s+([^`]+)`", page, re.DOTALL)
    assert recipe is not None and "experiment=million_devices" in recipe.group(0)
    preset = compose(["experiment=million_devices"])
    assert OmegaConf.to_container(preset, resolve=True) == OmegaConf.to_container(
        compose(recipe.group(1).split()), resolve=True
    )
    validate(preset)
    assert (preset.data.num_devices, preset.clients_per_round, preset.logger.progress) == (1_000_000, 10, None)


@pytest.mark.parametrize("option", _options("data"))
def test_every_data_option_trains_one_round_on_its_files(option: str, data_files: DataFiles) -> None:
    """Composed as on the command line, read from tiny real-format files, one round: natural clients where the data
    has owners (else 3 IID clients); logistic regression on features, a bag of words on token ids."""
    overrides = data_files([f"data={option}"], 60, 20) or pytest.fail(f"no tiny files for data={option}")
    split = instantiate(composed(overrides).data)
    partition = (
        ["partition=natural"] if split.train.groups is not None else ["partition=iid", "partition.num_clients=3"]
    )
    model = ["model=bag_of_words"] if split.train.x.dtype == torch.int64 else ["model=logreg"]
    if split.train.y.ndim == 2:  # token labels: a language model
        model = ["model=hf_causal_lm", "model.hidden_size=16", "model.num_layers=1", "adapter=lora"]
    cfg = compose([*overrides, *partition, *model, "num_rounds=1", "clients_per_round=2", "logger=quiet"])
    [round_one] = build_server(cfg).run().history
    assert round_one["client/num_aggregated"] == 2 and math.isfinite(round_one["train/loss"])
    assert round_one["eval/accuracy"] >= 0 and round_one["eval_global/clients"] == 2


REFERENCE_EXPERIMENTS = {  # the published setting each preset must keep: (clients per round, E, B, client lr)
    "femnist_cnn": (10, 1, 20, 0.1),  # Reddi et al. 2021, EMNIST CR
    "shakespeare_lstm": (10, 1, 4, 1.0),  # Reddi et al. 2021, Shakespeare
    "cifar100_resnet": (10, 1, 20, 0.1),  # Reddi et al. 2021, CIFAR-100
}


# rows written (train, test): the LEAF presets' 12 users get 10 training rows each (a few batches of the round);
# CIFAR-100's pachinko partition spreads the rows over 500 clients, and 600 gives each at least one
REFERENCE_ROWS = {"cifar100_resnet": (600, 60)}


@pytest.mark.parametrize(
    "option",
    [
        pytest.param(option, marks=pytest.mark.slow) if option == "cifar100_resnet" else option
        for option in sorted(REFERENCE_EXPERIMENTS)
    ],
)  # the ResNet: over 5 s
def test_reference_experiments_train_one_round_on_tiny_files(option: str, data_files: DataFiles) -> None:
    base = composed([f"experiment={option}"])
    setting = (base.clients_per_round, base.client.epochs, base.client.batch_size, base.client.optimizer.lr)
    assert setting == REFERENCE_EXPERIMENTS[option]
    overrides = data_files([f"experiment={option}"], *REFERENCE_ROWS.get(option, (120, 24))) or pytest.fail(option)
    result = build_server(compose([*overrides, "num_rounds=1", "logger=quiet"])).run()
    [round_one] = result.history
    assert round_one["client/num_aggregated"] == 10 and math.isfinite(round_one["train/loss"])
    assert 0 <= round_one["eval/accuracy"] <= 1


def test_experiment_presets_set_their_groups() -> None:
    cfg = composed(["experiment=mnist_cnn"])
    assert cfg.data._target_.endswith(".mnist") and cfg.model._target_.endswith("McMahanCNN")
    assert cfg.partition._target_.endswith(".shards") and cfg.client.epochs == 5
    assert compose(["experiment=mnist_cnn", "num_rounds=7"]).num_rounds == 7  # the command line wins


# --- validation in the Python API -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("client.optimizer.lr=-0.1", "client.optimizer.lr"),
        ("clients_per_round=31", "clients_per_round"),
        ("num_rounds=0", "num_rounds"),
        ("data.alpha=-1", "data.alpha"),
        ("min_success_fraction=0", "min_success_fraction"),
        ("client.epochs=0", "client.epochs"),
        ("client.local_steps=0", "client.local_steps"),
        ("client.lr_schedule.kind=linear", "client.lr_schedule.kind"),
        ("client.lr_schedule.gamma=0", "client.lr_schedule.gamma"),
        ("seed=-1", "seed"),
        ("eval_device=gpu", "eval_device"),
        ("eval_device=cuda:63", "eval_device"),
    ],
)
def test_build_server_rejects_bad_values_with_one_line_naming_the_field(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_server(compose([override]))
    message = str(info.value)
    assert message.startswith(field + " ") and "\n" not in message


def test_wrong_type_is_rejected_at_composition() -> None:
    with pytest.raises(Exception, match="num_rounds"):
        compose(["num_rounds=abc"])


# --- (b) the command line ----------------------------------------------------------------------------------
#
# Every command-line case runs once, one after another in this process (tests/cli_runner.py), in a module
# fixture; the tests below then look at one case each.


@dataclass(frozen=True)
class CliRun:
    proc: subprocess.CompletedProcess[str]
    cwd: Path
    run_dir: Path

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]


def _cli(args: list[str], cwd: Path, pythonpath: list[Path]) -> CliRun:
    cwd.mkdir(parents=True, exist_ok=True)
    run_dir = cwd / "run"
    proc = run_cli([*args, f"hydra.run.dir={run_dir}"], cwd=cwd, pythonpath=pythonpath)
    return CliRun(proc, cwd, run_dir)


BAD_CONFIGS = {  # case -> (overrides, the field the error line must name)
    "lr": (["client.optimizer.lr=-0.1"], "client.optimizer.lr"),
    "clients_per_round": (["clients_per_round=31"], "clients_per_round"),
    "dirichlet_alpha": (["data=mnist", "partition=dirichlet", "partition.alpha=0"], "partition.alpha"),
    "data_alpha": (["data.alpha=-1"], "data.alpha"),
    "num_rounds": (["num_rounds=0"], "num_rounds"),
    "lr_string": (["client.optimizer.lr=abc"], "client.optimizer.lr"),
    "mu_nan": (["strategy=fedprox", "strategy.mu=nan"], "strategy.mu"),
    "chunk_size_nan": (["executor=vmap", "executor.chunk_size=nan"], "executor.chunk_size"),
    "epochs_string": (["client.epochs=abc"], "client.epochs"),
    "not_a_strategy": (["strategy._target_=collections.OrderedDict"], "strategy._target_"),
    "not_an_executor": (["executor._target_=collections.OrderedDict"], "executor._target_"),
    "num_devices_zero": (["data.num_devices=0"], "data.num_devices must be >= 1"),
    "model_not_partial": (["~model._partial_"], "needs `_partial_: true`"),
    "dp_with_clock": (["dp=central", "clock=sampled"], "use clock=none"),  # refused by the server, after the logger
}
# Every case is checked in-process (build_server raises what the command line turns into its line); these also go
# through the command line itself: its one line on stderr, exit status 2, no file of the run.
CLI_BAD_CONFIGS = ("lr", "lr_string", "not_an_executor", "dp_with_clock")


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CliRun]:
    base = tmp_path_factory.mktemp("cli")
    mnist_root, empty = base / "mnist_files", base / "empty"
    vision_files.write_mnist(mnist_root, n_train=64, n_test=32)
    empty.mkdir()
    mnist = ["strategy=fedavg", "model=cnn", "data=mnist"]
    cases: dict[str, tuple[list[str], list[Path]]] = {  # case -> (arguments, folders on the path)
        "default": (["num_rounds=3"], []),
        "unknown_strategy": (["strategy=nonexistent"], []),
        "missing_mnist": ([*mnist, f"data.root={empty}"], []),
        "tiny_mnist": (
            [*mnist, f"data.root={mnist_root}", "partition.num_clients=4", "clients_per_round=2", "num_rounds=2"],
            [],
        ),
        "user_strategy": (
            [
                "strategy._target_=my_strategy.KeepGlobal",
                f"+strategy.marker={base / 'marker.log'}",
                "+data.max_size=60",
                "num_rounds=3",
                "clients_per_round=5",
            ],
            [USER_PKG],
        ),
        **{name: (BAD_CONFIGS[name][0], []) for name in CLI_BAD_CONFIGS},
    }
    runs = {name: _cli(args, base / name, pythonpath) for name, (args, pythonpath) in cases.items()}
    runs["marker"] = CliRun(runs["user_strategy"].proc, base, base / "marker.log")
    return runs


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("fedsim: error:"), stderr
    return lines[0]


def test_default_experiment_runs_from_the_command_line(cli: dict[str, CliRun]) -> None:
    run = cli["default"]
    assert run.proc.returncode == 0, run.proc.stderr
    assert "final test accuracy" in run.proc.stdout
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["rounds"] == 3 and 0.0 <= summary["final_accuracy"] <= 1.0
    assert f"{summary['final_accuracy']:.4f}" in run.proc.stdout
    assert not (run.cwd / "outputs").exists()  # hydra.run.dir was honoured


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_is_refused_in_one_line_naming_the_field_and_leaves_no_file(case: str, tmp_path: Path) -> None:
    overrides, field = BAD_CONFIGS[case]
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError) as caught:  # a ConfigError is one; the command line stops on it with exit 2
        build_server(compose(overrides), run_dir)
    assert field in str(caught.value) and "\n" not in str(caught.value)
    assert not run_dir.exists() or not any(run_dir.iterdir())


@pytest.mark.parametrize("case", CLI_BAD_CONFIGS)
def test_cli_rejects_bad_config_with_one_line_naming_the_field(case: str, cli: dict[str, CliRun]) -> None:
    run, field = cli[case], BAD_CONFIGS[case][1]
    assert run.proc.returncode == 2, run.proc.stderr
    assert field in _one_error_line(run.proc.stderr)
    assert {p.name for p in run.run_dir.iterdir()} <= {".hydra", "run.log"}  # failed before any work, left no file
    assert "final test accuracy" not in run.proc.stdout


def test_cli_unknown_group_option_names_the_group(cli: dict[str, CliRun]) -> None:
    proc = cli["unknown_strategy"].proc
    assert proc.returncode != 0
    assert "strategy" in proc.stderr and "nonexistent" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_missing_dataset_says_how_to_get_it(cli: dict[str, CliRun]) -> None:
    run = cli["missing_mnist"]
    assert run.proc.returncode == 2, run.proc.stderr
    line = _one_error_line(run.proc.stderr)
    assert "data.download" in line and "mnist" in line.lower() and "empty" in line
    assert not (run.run_dir / "metrics.jsonl").exists()


def test_cli_trains_on_tiny_mnist_files(cli: dict[str, CliRun]) -> None:
    run = cli["tiny_mnist"]
    assert run.proc.returncode == 0, run.proc.stderr
    assert "final test accuracy" in run.proc.stdout
    records = run.records()
    assert [r["round"] for r in records] == [1, 2]
    assert all(r["client/num_sampled"] == 2 for r in records)
    assert records[-1]["client/num_examples"] > 0


# Issue #34: bad values of the groups and of the schema's numbers, each refused before any work in one line that
# names the key as the user wrote it and the values it takes (exit status 2). "{files}" is the test's folder with a
# tiny MNIST (28x28 images) and a binary file posing as a device trace.
ISSUE_34 = {  # case -> (overrides, what the one line must contain)
    "dp_delta_at_least_1_over_n": (["dp=central", "dp.delta=0.5"], ["dp.delta=0.5", "30 clients", "1/30"]),
    "dp_clip_lr_negative": (["dp=adaptive", "dp.clip_lr=-1"], ["dp.clip_lr must be a finite number > 0"]),
    "qsgd_bits_not_integer": (
        ["compression.uplink=[{name: qsgd, bits: 4.5}]"],
        ["compression.uplink[0]", "qsgd.bits must be an integer between 2 and 8"],
    ),
    "error_feedback_not_boolean": (
        ["compression.error_feedback=no"],
        ["compression.error_feedback must be true or false"],
    ),
    "trigger_larger_than_image": (
        [
            "attack=backdoor",
            "attack.trigger_size=100",
            "data=mnist",
            "model=cnn",
            "data.root={files}/mnist",
            "partition=iid",
            "partition.num_clients=4",
            "clients_per_round=2",
        ],
        ["attack.trigger_size=100", "28×28", "between 1 and 28"],
    ),
    "topk_fraction_not_number": (
        ["compression.uplink=[{name: topk, fraction: abc}]"],
        ["compression.uplink[0]", "topk.fraction must be in (0, 1]"],
    ),
    "clock_period_h_zero": (["clock=sampled", "clock.period_h=0"], ["clock.period_h must be"]),
    "trace_binary_file": (["clock=trace", "clock.path={files}/trace.bin"], ["trace.bin", "not UTF-8"]),
    "seed_string": (["seed=abc"], ["seed must be an integer >= 0 (got abc)"]),
    "seed_inf": (["seed=inf"], ["seed must be an integer >= 0 (got inf)"]),
    "num_rounds_string": (["num_rounds=abc"], ["num_rounds must be an integer >= 1 (got abc)"]),
    "num_rounds_fraction": (["num_rounds=1.5"], ["num_rounds must be an integer >= 1 (got 1.5)"]),
    "clients_per_round_nan": (["clients_per_round=nan"], ["clients_per_round must be an integer >= 1 (got nan)"]),
    "strategy_target_unknown": (["strategy._target_=fedsim.nope.Nope"], ["strategy._target_=fedsim.nope.Nope"]),
}


@pytest.mark.parametrize("case", list(ISSUE_34))
def test_cli_refuses_bad_group_and_schema_values_in_one_line_before_any_work(case: str, tmp_path: Path) -> None:
    files, run_dir = tmp_path / "files", tmp_path / "run"
    vision_files.write_mnist(files / "mnist", n_train=32, n_test=16)
    (files / "trace.bin").write_bytes(bytes([0x00, 0xB4, 0xFF, 0x0A]) * 16)
    overrides, needed = ISSUE_34[case]
    args = [o.replace("{files}", str(files)) for o in overrides]
    rounds = [] if any(a.startswith("num_rounds=") for a in args) else ["num_rounds=1"]
    proc = run_cli([*args, *rounds, "logger.progress=false", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc.stderr)
    assert all(text.replace("{files}", str(files)) in line for text in needed), line
    assert "final test accuracy" not in proc.stdout
    assert not run_dir.exists() or {p.name for p in run_dir.iterdir()} <= {".hydra", "run.log"}


# Every key of the dp, compression, clock, attack, evaluate_clients and tracker groups, out of its range, through the
# Python API: build_server raises the ValueError the command line prints as its one line.
GROUP_KEYS = [  # (overrides, the key the line must name)
    (["dp=central", "dp.noise_multiplier=0"], "dp.noise_multiplier"),
    (["dp=central", "dp.clip_norm=-1"], "dp.clip_norm"),
    (["dp=central", "dp.delta=0"], "dp.delta"),
    (["dp=central", "dp.delta=0.04"], "dp.delta"),
    (["dp=central", "dp.epsilon_max=0"], "dp.epsilon_max"),
    (["dp=central", "dp.adaptive=no"], "dp.adaptive"),
    (["dp=adaptive", "dp.target_quantile=1.5"], "dp.target_quantile"),
    (["dp=adaptive", "dp.clip_lr=0"], "dp.clip_lr"),
    (["dp=adaptive", "dp.count_noise=0"], "dp.count_noise"),
    (["compression.uplink=topk"], "compression.uplink"),
    (["compression.uplink=[{name: qsgd, bucket_size: 0.5}]"], "qsgd.bucket_size"),
    (["compression.uplink=[{name: random_mask, fraction: 0}]"], "random_mask.fraction"),
    (["compression.uplink=[{_target_: fedsim.comm.Nope}]"], "compression.uplink[0]._target_"),
    (["compression.downlink=[5]"], "compression.downlink[0]"),
    (["compression.error_feedback=1"], "compression.error_feedback"),
    (["clock=sampled", "clock.deadline_s=0"], "clock.deadline_s"),
    (["clock=sampled", "clock.over_selection=-1"], "clock.over_selection"),
    (["clock=sampled", "clock.speed_median=0"], "clock.speed_median"),
    (["clock=sampled", "clock.speed_sigma=-1"], "clock.speed_sigma"),
    (["clock=sampled", "clock.upload_mbps=0"], "clock.upload_mbps"),
    (["clock=sampled", "clock.upload_sigma=-1"], "clock.upload_sigma"),
    (["clock=sampled", "clock.download_mbps=-3"], "clock.download_mbps"),
    (["clock=sampled", "clock.download_sigma=nan"], "clock.download_sigma"),
    (["clock=sampled", "clock.always_online=no"], "clock.always_online"),
    (["clock=sampled", "clock.online_fraction_mean=1.5"], "clock.online_fraction_mean"),
    (["clock=trace"], "clock.path"),
    (["clock=trace", "clock.path=7"], "clock.path"),
    (["attack=sign_flip", "attack.fraction=2"], "attack.fraction"),
    (["attack=sign_flip", "attack.per_round=no"], "attack.per_round"),
    (["attack=sign_flip", "attack.scale=abc"], "attack.scale"),
    (["attack=gaussian", "attack.std=-1"], "attack.std"),
    (["attack=scaling", "attack.boost=inf"], "attack.boost"),
    (["attack=alie", "attack.z=nan"], "attack.z"),
    (["attack=ipm", "attack.epsilon=0"], "attack.epsilon"),
    (["attack=label_flip", "attack.source=1", "attack.target=99"], "attack.target"),
    (["attack=backdoor", "attack.poison_fraction=0"], "attack.poison_fraction"),
    (["attack=backdoor", "attack.trigger_size=2.5"], "attack.trigger_size"),
    (["attack=backdoor", "attack.trigger_size=61"], "attack.trigger_size"),
    (["attack=backdoor", "attack.trigger_value=nan"], "attack.trigger_value"),
    (["evaluate_clients.who=bogus"], "evaluate_clients.who"),
    (["evaluate_clients=cohort", "evaluate_clients.size=0"], "evaluate_clients.size"),
    (["evaluate_clients=cohort", "evaluate_clients.size=31"], "evaluate_clients.size"),
    (["evaluate_clients.every=0"], "evaluate_clients.every"),
    (["tracker=mlflow", "tracker.experiment=[a]"], "tracker.experiment"),
    (["tracker=mlflow", "tracker.run_name=2024"], "tracker.run_name"),
    (["tracker=wandb", "tracker.settings=abc"], "tracker.settings"),
    (["tracker=wandb", "tracker.mode=5"], "tracker.mode"),
]


@pytest.mark.parametrize(("overrides", "key"), GROUP_KEYS, ids=[" ".join(o) for o, _ in GROUP_KEYS])
def test_every_group_key_out_of_range_is_one_line_naming_it(overrides: list[str], key: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError) as caught:  # a ConfigError is one
        build_server(compose(["num_rounds=1", *overrides]), run_dir)
    assert key in str(caught.value) and "\n" not in str(caught.value)
    assert not run_dir.exists() or not any(run_dir.iterdir())


# --- (c) a user's strategy class from outside the package ---------------------------------------------------


def test_user_strategy_from_outside_the_package_by_target(cli: dict[str, CliRun]) -> None:
    # KeepGlobal takes only its own argument (no **kwargs): swapping ``strategy._target_`` must not
    # hand it the default strategy's parameters.
    run = cli["user_strategy"]
    assert run.proc.returncode == 0, run.proc.stderr
    calls = cli["marker"].run_dir.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["round=1", "round=2", "round=3"]
    assert all(len(c.split()[1].removeprefix("clients=").split(",")) == 5 for c in calls)
    records = run.records()
    # the global model never moves: every evaluation equals the first, though the clients trained
    assert len({(r["eval/accuracy"], r["eval/loss"]) for r in records}) == 1
    assert all(r["train/loss"] > 0 for r in records)


# --- (d) observability: TensorBoard and metrics.jsonl agree ----------------------------------------------------

SCALARS = ("train/loss", "eval/loss", "eval/accuracy", "client/num_sampled", "time/round_s")


def test_tensorboard_and_metrics_jsonl_record_every_round(cli: dict[str, CliRun]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = cli["default"]
    assert run.proc.returncode == 0, run.proc.stderr
    events = EventAccumulator(str(run.run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    records = run.records()
    assert [r["round"] for r in records] == [1, 2, 3]
    for tag in SCALARS:
        scalars = events.Scalars(tensorboard_tag(tag))
        assert [e.step for e in scalars] == [1, 2, 3], tag
        for event, record in zip(scalars, records, strict=True):
            assert math.isclose(event.value, record[tag], rel_tol=1e-6, abs_tol=1e-9), (tag, event, record)
    assert [r["client/num_sampled"] for r in records] == [10.0, 10.0, 10.0]
    assert all(0.0 <= r["eval/accuracy"] <= 1.0 and r["time/round_s"] >= 0 for r in records)

    [config] = events.Tensors("config/text_summary")
    text = config.tensor_proto.string_val[0].decode()
    assert "num_rounds: 3" in text and "fedsim.data.synthetic.synthetic" in text

    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["final_accuracy"] == pytest.approx(records[-1]["eval/accuracy"])
    assert summary["best_accuracy"] == pytest.approx(max(r["eval/accuracy"] for r in records))
    assert summary["final_loss"] == pytest.approx(records[-1]["eval/loss"])


# --- (e) the Python API ------------------------------------------------------------------------------------------


def test_run_config_from_python(tmp_path: Path) -> None:
    cfg = compose(["num_rounds=2", "+data.max_size=60", "clients_per_round=4", "logger=quiet"])
    result = run_config(cfg, run_dir=tmp_path)
    assert isinstance(result, RunResult)
    assert [r["round"] for r in result.history] == [1, 2]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["final_accuracy"] == pytest.approx(result.history[-1]["eval/accuracy"])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2]
    assert not (tmp_path / "tensorboard").exists()  # logger=quiet: no event files

    again = run_config(cfg)  # no run_dir: nothing written, same answer
    assert torch.equal(again.params, result.params)
