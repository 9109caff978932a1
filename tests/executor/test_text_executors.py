"""Text models through fedsim under every executor: the process and Ray executors give the serial run's weights
bit for bit; vmap (torch.func runs nn.LSTM and embeddings) matches it within a float32 rounding bound.

The federations are tiny: real LEAF Shakespeare files (4 roles) for the character LSTM, and Sent140-like token rows
for the others; 4 users with their own train and test rows (``natural`` clients),
short sequences and small LSTMs, so that a run costs tens of milliseconds and the executors' start-up dominates.
"""

from __future__ import annotations

import functools
import math
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import sgd, tiny_server

from fedsim.client.base import Client
from fedsim.client.federation import FederatedData, federate
from fedsim.core.params import flatten
from fedsim.data.leaf import shakespeare
from fedsim.data.partition import natural
from fedsim.data.tensor_data import DataSplit
from fedsim.data.text import NUM_CHARACTER_IDS
from fedsim.executor import ProcessExecutor, SerialExecutor, VmapExecutor
from fedsim.models.text import BagOfWords, CharLSTM, SentimentLSTM
from fedsim.observe.run_logger import RunLogger
from fedsim.server.server import RunResult

SEQ_LEN, WORDS = 12, 40
ROUNDS, PER_ROUND, EPOCHS, BATCH = 2, 3, 2, 8
TRAIN_SIZES, TEST_SIZES = (14, 22, 9, 30), (3, 4, 2, 5)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))  # tests/data: real-format file writers
import leaf_files  # noqa: E402


def token_split(vocab: int, num_classes: int, padded: bool, seed: int = 0) -> DataSplit:
    """Random token rows for 4 users (each with its own test rows); ``padded``: rows end in 0-padding of random
    length (Sent140-like), else windows of ids >= 0 without padding (Shakespeare-like)."""
    rng = np.random.default_rng(seed)

    def rows(n: int) -> np.ndarray:
        x = rng.integers(2 if padded else 0, vocab, size=(n, SEQ_LEN))
        if padded:
            lengths = rng.integers(1, SEQ_LEN + 1, size=n)
            x[np.arange(SEQ_LEN) >= lengths[:, None]] = 0
        return x

    owners = np.repeat(np.arange(4), TRAIN_SIZES)
    test_owners = np.repeat(np.arange(4), TEST_SIZES)
    return DataSplit.from_arrays(
        rows(len(owners)),
        rng.integers(0, num_classes, len(owners)),
        rows(len(test_owners)),
        rng.integers(0, num_classes, len(test_owners)),
        num_classes=num_classes,
        client_ids=owners,
        test_client_ids=test_owners,
    )


_LEAF_DIR = tempfile.TemporaryDirectory(prefix="fedsim-leaf-")  # removed when the test process exits


def shakespeare_split() -> DataSplit:
    """Real LEAF Shakespeare files (4 roles, 2 train files and 1 test file; tests/data/leaf_files.py) read by
    ``data=shakespeare``'s loader, keeping the last ``SEQ_LEN`` characters of each 80-character window."""
    leaf_files.write_leaf(_LEAF_DIR.name, "shakespeare", sum(TRAIN_SIZES), sum(TEST_SIZES), users=4)
    return shakespeare(root=_LEAF_DIR.name, seq_length=SEQ_LEN)


@functools.cache
def federation(padded: bool) -> FederatedData:
    split = token_split(WORDS, 2, padded=True) if padded else shakespeare_split()
    return federate(split, functools.partial(natural), client_test_fraction=0.0, seed=0)


MODELS = {
    "char_lstm": (False, functools.partial(CharLSTM, input_shape=(SEQ_LEN,), num_classes=NUM_CHARACTER_IDS, hidden=16)),
    "sent_lstm": (
        True,
        functools.partial(
            SentimentLSTM, input_shape=(SEQ_LEN,), num_classes=2, vocab_size=WORDS, embed_dim=8, hidden=12, fc_units=10
        ),
    ),
    "bag_of_words": (
        True,
        functools.partial(BagOfWords, input_shape=(SEQ_LEN,), num_classes=2, vocab_size=WORDS, embed_dim=8),
    ),
}


def run(executor, model: str = "char_lstm", rounds: int = ROUNDS, spec: tuple | None = None) -> RunResult:  # noqa: ANN001
    """A ``rounds``-round FedAvg run of ``MODELS[model]`` (or of ``spec``: (padded data?, model factory))."""
    padded, factory = spec or MODELS[model]
    return tiny_server(
        federation(padded),
        model=factory,
        client=functools.partial(Client, epochs=EPOCHS, batch_size=BATCH, optimizer=sgd(0.5)),
        executor=executor,
        num_rounds=rounds,
        clients_per_round=PER_ROUND,
        seed=7,
        logger=RunLogger(None, tensorboard=False, progress=False),
    ).run()


@functools.cache
def serial_reference(model: str) -> RunResult:
    return run(SerialExecutor(), model)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_two_rounds_train_every_text_model(model: str) -> None:
    """A 2-round serial run: the weights move, losses are finite, clients are the 4 users with their own tests."""
    result = serial_reference(model)
    one_round = run(SerialExecutor(), model, rounds=1).params
    assert not torch.equal(result.params, one_round), "round 2 must move the weights"
    assert torch.isfinite(result.params).all()
    losses = [c["train_loss"] for r in result.history for c in r["clients"]]
    assert len(losses) == ROUNDS * PER_ROUND and all(math.isfinite(v) for v in losses)
    data = federation(MODELS[model][0])
    assert data.num_clients == 4 and sum(len(t) for t in data.client_test) == sum(TEST_SIZES)


@pytest.mark.parametrize("workers", [1, 3])
def test_process_executor_is_bitwise_serial_for_char_lstm(workers: int) -> None:
    result = run(ProcessExecutor(devices="cpu", workers=workers))
    assert torch.equal(result.params, serial_reference("char_lstm").params)
    if workers > 1:
        assert len({c["worker"] for r in result.history for c in r["clients"]}) > 1, "tasks should spread over workers"


# Ray: tests/executor/ray/test_ray.py::test_char_lstm_bitwise_equal_to_serial (it shares that module's Ray instance)


UNIT_ROUNDOFF = 2.0**-24  # float32


def tolerance(sequential_steps: int, longest_sum: int) -> float:
    """As in test_vmap.py: the relative weight error that float32 rounding alone allows between two summation
    orders: sqrt(longest sum) unit roundoffs per dependent step, adding up linearly along the longest chain."""
    return sequential_steps * math.sqrt(longest_sum) * UNIT_ROUNDOFF


# Longest chain: rounds × epochs × a client's steps (ceil(30 / 8)), each step a recurrence of SEQ_LEN dependent
# time steps. Longest sum: a weight gradient over a batch's BATCH × SEQ_LEN positions.
LSTM_TOLERANCE = tolerance(ROUNDS * EPOCHS * math.ceil(max(TRAIN_SIZES) / BATCH) * SEQ_LEN, BATCH * SEQ_LEN)  # 1.1e-4


# vmap has no batched LSTM kernel: it warns, and loops over the chunk's clients for that op
@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize("model", sorted(MODELS))
def test_vmap_matches_serial_within_float32_rounding(model: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="fedsim"):
        vmapped = run(VmapExecutor(chunk_size=3), model)
    reference = serial_reference(model).params
    error = float((vmapped.params - reference).norm() / reference.norm())
    assert error <= LSTM_TOLERANCE
    said = [r.getMessage() for r in caplog.records if "one client at a time" in r.getMessage()]
    assert len(said) == (model != "bag_of_words"), "vmap says at start-up that it cannot batch an LSTM"


def test_frozen_glove_is_read_by_every_worker_and_not_federated(tmp_path: Path) -> None:
    """A frozen GloVe table stays out of the federated weights: each worker builds it from the file, the process
    executor still gives the serial weights bit for bit, and vmap (which reads the table as a fixed buffer) matches."""
    rng = np.random.default_rng(1)
    glove = tmp_path / "glove.txt"
    glove.write_text(
        "".join(f"w{i} " + " ".join(f"{v:.5f}" for v in rng.normal(size=6)) + "\n" for i in range(WORDS - 2))
    )
    factory = functools.partial(
        SentimentLSTM, input_shape=(SEQ_LEN,), num_classes=2, glove=str(glove), hidden=8, fc_units=6
    )
    learned = functools.partial(
        SentimentLSTM, input_shape=(SEQ_LEN,), num_classes=2, vocab_size=WORDS, embed_dim=6, hidden=8, fc_units=6
    )
    assert flatten(factory()).numel() == flatten(learned()).numel() - WORDS * 6
    serial = run(SerialExecutor(), spec=(True, factory))
    process = run(ProcessExecutor(devices="cpu", workers=2), spec=(True, factory))
    assert torch.equal(serial.params, process.params)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "There is a performance drop", UserWarning)
        vmapped = run(VmapExecutor(chunk_size=3), spec=(True, factory))
    assert float((vmapped.params - serial.params).norm() / serial.params.norm()) <= LSTM_TOLERANCE
