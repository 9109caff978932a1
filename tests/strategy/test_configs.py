"""Every strategy of issue #4 is selectable as ``strategy=<name>``, its config lists exactly the constructor's
parameters with their defaults, and each parameter is overridable from the command line.

test_server_opt.py and test_robust.py check this for their own families; this file checks it for every
option in conf/strategy/ at once (FedAvg, FedProx and SCAFFOLD included), so a new strategy whose config
forgets a parameter, or whose parameter has no command-line override here, fails.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from composed import composed
from hydra.utils import get_method, instantiate

from fedsim.cli.run import CONFIG_DIR, build_server, compose
from fedsim.strategy import Strategy

ISSUE_4 = {
    "fedavg",
    "fedavgm",
    "fedadam",
    "fedyogi",
    "fedadagrad",
    "fedprox",
    "scaffold",
    "median",
    "trimmed_mean",
    "krum",
}
OPTIONS = sorted(p.stem for p in (Path(CONFIG_DIR) / "strategy").glob("*.yaml"))

# a valid, non-default command-line value for every strategy parameter, and what the strategy must hold then
OVERRIDES: dict[str, tuple[str, object]] = {
    "mu": ("1.5", 1.5),
    "server_lr": ("0.25", 0.25),
    "momentum": ("0.5", 0.5),
    "beta2": ("0.9", 0.9),
    "tau": ("0.01", 0.01),
    "bias_correction": ("true", True),
    "initial_accumulator": ("0.5", 0.5),
    "beta": ("0.25", 0.25),
    "f": ("2", 2),
    "m": ("3", 3),
    "personal_layers": ("fc", "fc"),
    "norm_layers": ("bn", "bn"),
    "alpha": ("0.1", 0.1),
    "lam": ("0.5", 0.5),
    "personal_epochs": ("2", 2),
    "head_epochs": ("3", 3),
    "q": ("2.0", 2.0),
    "lipschitz": ("5.0", 5.0),
    "sampling": ("uniform", "uniform"),
    "buffer_size": ("4", 4),
    "concurrency": ("7", 7),
    "staleness_exponent": ("1.0", 1.0),
    "max_norm": ("0.5", 0.5),
    "weighted": ("false", False),
    "iterations": ("3", 3),
    "num_buffers": ("4", 4),
    "rule": ("trimmed_mean", "trimmed_mean"),
    "trim": ("0.1", 0.1),
    "root_size": ("50", 50),
    "b": ("2", 2),
    "rho": ("0.01", 0.01),
    "adapt_alpha": ("true", True),
    "personal_lr": ("0.05", 0.05),
    "inner_steps": ("3", 3),
    "variant": ("hf", "hf"),
    "delta": ("0.01", 0.01),
    "temperature": ("0.2", 0.2),
}


def test_every_strategy_of_the_issue_has_a_config() -> None:
    assert set(OPTIONS) >= ISSUE_4


@pytest.mark.parametrize("option", OPTIONS)
def test_config_lists_every_constructor_parameter_with_its_default(option: str) -> None:
    cfg = composed([f"strategy={option}"])
    params = inspect.signature(get_method(cfg.strategy._target_)).parameters
    assert {key for key in cfg.strategy if key != "_target_"} == set(params)
    assert all(cfg.strategy[name] == p.default for name, p in params.items())
    assert isinstance(instantiate(cfg.strategy), Strategy)


@pytest.mark.parametrize("option", OPTIONS)
def test_every_parameter_is_overridable_from_the_command_line(option: str) -> None:
    defaults = composed([f"strategy={option}"]).strategy
    for key in sorted(set(defaults) - {"_target_"}):
        assert key in OVERRIDES, f"add a non-default value for strategy.{key} to OVERRIDES"
        text, value = OVERRIDES[key]
        assert defaults[key] != value, key  # the override must be visible
        strategy = instantiate(compose([f"strategy={option}", f"strategy.{key}={text}"]).strategy)
        assert getattr(strategy, key) == value, key


def test_a_bad_strategy_value_from_the_command_line_names_the_field() -> None:
    for overrides, message in (
        (["strategy=fedprox", "strategy.mu=-1"], "strategy.mu must be a finite number >= 0"),
        (["strategy=scaffold", "state_store=cloud"], "state_store must be memory or disk"),
    ):
        with pytest.raises(ValueError, match=message):
            build_server(compose(overrides))


def test_the_readme_names_every_strategy_in_its_list() -> None:
    """The README's "Strategies built in" paragraph names every option of conf/strategy/ (a new strategy is added
    there in the same change)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    start = readme.index("Strategies built in (`strategy=...`):")
    listed = set(re.findall(r"`([a-z0-9_]+)`", readme[start : readme.index("Also:", start)]))
    assert [option for option in OPTIONS if option not in listed] == []
