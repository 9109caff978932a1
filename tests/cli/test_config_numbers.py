"""Every number of every group section is checked against its constructor's parameter before any work."""

from __future__ import annotations

import pytest

from fedsim.cli.config import ConfigError, validate
from fedsim.cli.run import compose

CASES = [  # (overrides, the one line's start)
    (["client.optimizer.lr=abc"], "client.optimizer.lr must be a number (got 'abc')"),
    (["client.optimizer.lr=inf"], "client.optimizer.lr must be a finite number (got inf)"),
    (["client.optimizer.momentum=-inf"], "client.optimizer.momentum must be a finite number"),
    (["strategy=fedprox", "strategy.mu=nan"], "strategy.mu must be a finite number (got nan)"),
    (["strategy=fedadam", "strategy.tau=true"], "strategy.tau must be a number (got True)"),
    (["executor=vmap", "executor.chunk_size=nan"], "executor.chunk_size must be an integer or null (got nan)"),
    (["executor=process", "executor.workers=abc"], "executor.workers must be an integer or null (got 'abc')"),
    (["executor=process", "executor.client_timeout_s=nan"], "executor.client_timeout_s must be a finite number"),
    (["client.epochs=abc"], "client.epochs must be an integer (got 'abc')"),
    (["client.batch_size=2.5"], "client.batch_size must be an integer (got 2.5)"),
    (["data.num_devices=many"], "data.num_devices must be an integer (got 'many')"),
    (["partition=dirichlet", "partition.alpha=nan"], "partition.alpha must be a finite number (got nan)"),
]


@pytest.mark.parametrize(("overrides", "line"), CASES, ids=[" ".join(o) for o, _ in CASES])
def test_a_bad_number_names_its_field(overrides: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate(compose(overrides))
    assert str(caught.value).startswith(line)
    assert len(str(caught.value).splitlines()) == 1


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["client.optimizer.lr=1"],
        ["executor=vmap", "executor.chunk_size=null"],
        ["executor=process", "executor.workers=2"],
        ["strategy=fedprox", "strategy.mu=0"],
        ["client=adam"],
        ["strategy=fedper"],
    ],
)
def test_good_numbers_pass(overrides: list[str]) -> None:
    validate(compose(overrides))


def test_a_user_class_is_checked_by_its_own_signature(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "my_clients.py").write_text(
        "from fedsim.client.base import Client\n\n"
        "class Tempered(Client):\n"
        "    def __init__(self, *args, temperature: float = 1.0, rounds: int = 3, **kwargs):\n"
        "        super().__init__(*args, **kwargs)\n"
        "        self.temperature, self.rounds = temperature, rounds\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    validate(compose(["client._target_=my_clients.Tempered", "+client.temperature=0.5", "+client.rounds=4"]))
    with pytest.raises(ConfigError, match=r"^client.temperature must be a finite number \(got nan\)$"):
        validate(compose(["client._target_=my_clients.Tempered", "+client.temperature=nan"]))
    with pytest.raises(ConfigError, match=r"^client.rounds must be an integer \(got 1.5\)$"):
        validate(compose(["client._target_=my_clients.Tempered", "+client.rounds=1.5"]))


def test_checkpoints_existing_as_a_file_is_one_line_before_any_work(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from cli_runner import run_cli

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("not a directory")
    done = run_cli(["num_rounds=1", f"hydra.run.dir={run_dir}"])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == (
        f"fedsim: error: {run_dir / 'checkpoints'} exists and is not a directory; "
        "move it away or choose another hydra.run.dir"
    )
    assert not (run_dir / "metrics.jsonl").exists()
