"""A typo in a key or an option never runs silently: one line naming it, a "did you mean", exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import run_cli
from composed import composed
from hydra.errors import HydraException

from fedsim.cli.config import ConfigError, RunSchema
from fedsim.cli.config_keys import check_keys
from fedsim.cli.override_errors import override_error_line
from fedsim.cli.run import CONFIG_DIR, build_server, compose

GROUPS = ("data", "partition", "model", "client", "strategy", "executor", "experiment")
OPTIONS = [(group, path.stem) for group in GROUPS for path in sorted((Path(CONFIG_DIR) / group).glob("*.yaml"))]


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_shipped_option_has_only_keys_its_target_reads(group: str, option: str) -> None:
    check_keys(composed([f"{group}={option}"]), RunSchema, ConfigError)  # tests/cli/test_config.py composes them too


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["+num_round=3"], "unknown setting num_round; did you mean num_rounds?"),
        (["+client.epoch=2"], "unknown setting client.epoch; did you mean client.epochs? (fedsim.client.Client takes "),
        (
            ["+client.optimizer.moment=0.9"],
            "unknown setting client.optimizer.moment; did you mean client.optimizer.momentum?",
        ),
        (["strategy=fedprox", "+strategy.muu=0.1"], "unknown setting strategy.muu; did you mean strategy.mu?"),
    ],
)
def test_an_added_key_nothing_reads_is_refused_before_any_work(overrides: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as raised:
        build_server(compose(overrides))
    assert str(raised.value).startswith(line) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["num_round=3"],
            "unknown setting num_round; did you mean num_rounds? (a typo? `+num_round=...` would add a key "
            "that fedsim does not read)",
        ),
        (["client=sgd", "client.epoch=3"], "unknown setting client.epoch; did you mean client.epochs?"),
        (["strategy=fedprox", "strategy.muu=0.1"], "unknown setting strategy.muu; did you mean strategy.mu?"),
        (
            ["strategy=fedadamm"],
            "no option fedadamm in group strategy; did you mean fedadam? (options: apfl, basgd, bulyan, "
            "centered_clipping, ditto, fedadagrad, ",
        ),
        (["stratgy=fedadam"], "unknown setting stratgy; did you mean strategy?"),
    ],
)
def test_hydras_refusal_of_an_override_becomes_one_line(overrides: list[str], line: str) -> None:
    with pytest.raises(HydraException) as raised:
        compose(overrides)
    message = override_error_line(raised.value, overrides)
    assert message is not None and message.startswith(line) and "\n" not in message


def test_the_command_line_says_it_in_one_line_with_status_2(tmp_path: Path) -> None:
    done = run_cli(["num_round=3", f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "fedsim: error: unknown setting num_round; did you mean num_rounds? (a typo? `+num_round=...` would add a key "
        "that fedsim does not read)"
    ]
    assert not (tmp_path / "run").exists(), "nothing was started"
