"""A sweep over the adapter group with the adapters' own keys (issue #43): each job's keys are checked against that
job's option, not against the group's default (adapter=none, which has no ``r``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_runner import run_cli

from fedsim.cli.sweep_check import sweep_arguments
from fedsim.core.checkpoint import load_checkpoint

HIDDEN, LAYERS = 16, 1


def _args(files: dict[str, Path], sweep_dir: Path, *extra: str) -> list[str]:
    """A 1-round sweep of 2 of the 4 users' clients on the instruction file."""
    return [
        "-m",
        "model=hf_causal_lm",
        f"model.hidden_size={HIDDEN}",
        f"model.num_layers={LAYERS}",
        "data=jsonl_instructions",
        f"data.path={files['data']}",
        f"data.tokenizer={files['tokenizer']}",
        "data.seq_len=16",
        "data.user_column=user",
        "partition=natural",
        "num_rounds=1",
        "clients_per_round=2",
        "logger.progress=false",
        f"hydra.sweep.dir={sweep_dir}",
        *extra,
    ]


def test_the_defaults_sweep_level_composition_gets_the_first_swept_option() -> None:
    argv = ["-m", "adapter=lora,ffa_lora", "adapter.r=4", "model=hf_causal_lm"]
    assert sweep_arguments(argv) == ["-m", "adapter=lora", "adapter=lora,ffa_lora", "adapter.r=4", "model=hf_causal_lm"]
    assert sweep_arguments(argv[1:]) == argv[1:]  # a single run: Hydra composes it as it is
    composes_as_it_is = ["-m", "strategy=fedavg,fedprox", "seed=0,1"]  # no key of a swept group: nothing added
    assert sweep_arguments(composes_as_it_is) == composes_as_it_is


@pytest.mark.slow
def test_a_sweep_of_lora_and_ffa_lora_with_r_runs_both_jobs(llm_files: dict[str, Path], tmp_path: Path) -> None:
    run = run_cli(
        _args(llm_files, tmp_path / "sweep", "adapter=lora,ffa_lora", "adapter.r=4", "adapter.target_modules=[c_attn]")
    )
    assert run.returncode == 0, run.stderr
    jobs = sorted(p for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert [job.name.split("_", 1)[0] for job in jobs] == ["0", "1"]
    for job, adapter, trained_per_layer in zip(jobs, ["lora", "ffa_lora"], [4 * HIDDEN, 3 * HIDDEN], strict=True):
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        assert f"adapter={adapter}" in overrides and "adapter.r=4" in overrides
        assert len([o for o in overrides if o.startswith("adapter=")]) == 1  # the job's own, as a plain sweep's
        assert json.loads((job / "summary.json").read_text())["finished"]
        # r=4 reached the model: LoRA federates A (r x H) and B (3H x r) of c_attn, FFA-LoRA only B
        params = load_checkpoint(sorted((job / "checkpoints").glob("*.ckpt"))[-1])["params"]
        assert params.numel() == LAYERS * 4 * trained_per_layer


@pytest.mark.parametrize(
    ("sweep", "names"),
    [
        (["adapter=none,lora", "adapter.r=4"], "unknown setting adapter.r in the sweep's jobs with adapter=none"),
        (["adapter=lora,ffa_lora", "adapter.rr=4"], "unknown setting adapter.rr; did you mean adapter.r?"),
        (["adapter=lora,lorra", "adapter.r=4"], "no option lorra in group adapter; did you mean lora?"),
    ],
)
def test_a_key_wrong_for_a_swept_option_is_one_line_before_any_job(
    sweep: list[str], names: str, llm_files: dict[str, Path], tmp_path: Path
) -> None:
    run = run_cli(_args(llm_files, tmp_path / "sweep", *sweep))
    assert run.returncode == 2
    assert run.stderr.splitlines() == [run.stderr.strip()] and run.stderr.startswith(f"fedsim: error: {names}")
    assert run.stdout == "" and not (tmp_path / "sweep").exists()
