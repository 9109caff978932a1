"""A LoRA run from the command line prints fedsim's lines only (issue #41): the PEFT and transformers warnings of
building the model (``fan_in_fan_out is set to False ...``, ``is_gradient_checkpointing is deprecated ...``) and
transformers' own log lines go to run.log, in the parent and in process workers (their own log files), and a
refusal after the model is built, such as a resume with another ``adapter.r``, is exactly one line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from cli_runner import run_cli, warnings_on_stderr
from test_lora_runs import args
from test_pretrained_dir import saved_model

LORA = ["adapter=lora", "adapter.target_modules=[c_attn]"]
LIBRARY_WARNINGS = ("UserWarning: fan_in_fan_out is set to False", "FutureWarning: `is_gradient_checkpointing`")


@pytest.fixture(scope="module")
def lora_run(llm_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """A finished 1-round LoRA run (r = 8) with the default logger, and what the command printed."""
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    with warnings_on_stderr():
        done = run_cli(args(llm_files, run_dir, "num_rounds=1", *LORA))
    return run_dir, done


@pytest.mark.slow
def test_a_lora_run_prints_fedsim_lines_only_and_run_log_keeps_the_warnings(lora_run: tuple[Path, object]) -> None:
    run_dir, done = lora_run
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("final test perplexity: ")
    assert all("][fedsim][" in line for line in lines[:-1]), done.stdout
    log = (run_dir / "run.log").read_text()
    for warning in LIBRARY_WARNINGS:
        assert warning in log and "[py.warnings][WARNING]" in log


@pytest.mark.slow
def test_a_resume_with_another_adapter_rank_names_it_in_one_line(
    lora_run: tuple[Path, object], llm_files: dict[str, Path]
) -> None:
    run_dir, _ = lora_run
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    with warnings_on_stderr():
        done = run_cli(args(llm_files, run_dir, "num_rounds=2", *LORA, "adapter.r=4", "resume=true"))
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("fedsim: error: resume from ") and "adapter.r (8 -> 4)" in line
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics and not (run_dir / "resume_changes.jsonl").exists()
    assert run_dir.joinpath("run.log").read_text().count(LIBRARY_WARNINGS[0]) == 2  # the model was built again


@pytest.mark.slow
def test_process_workers_keep_their_warnings_in_their_logs(llm_files: dict[str, Path], tmp_path: Path) -> None:
    """Under logger=quiet the console holds the result line and nothing else."""
    process = ["executor=process", "executor.devices=cpu", "executor.workers=2"]
    with warnings_on_stderr():
        done = run_cli(args(llm_files, tmp_path, "num_rounds=1", *LORA, *process, "logger=quiet"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and len(done.stdout.splitlines()) == 1
    assert done.stdout.startswith("final test perplexity: ")
    for worker in ("worker-0.log", "worker-1.log"):
        log = (tmp_path / "workers" / worker).read_text()
        assert all(warning in log for warning in LIBRARY_WARNINGS)


@pytest.mark.slow
def test_transformers_own_log_lines_go_to_run_log(llm_files: dict[str, Path], tmp_path: Path) -> None:
    """A classifier from a causal LM's directory: transformers reports the new head through its own stderr handler
    (and shows a progress bar while loading); the run is then refused, after the model was built, in one line."""
    saved_model(llm_files, tmp_path / "gpt2-tiny")
    library = logging.getLogger("transformers")
    before = (list(library.handlers), library.propagate)
    classifier = [
        "model=hf_seq_cls",
        f"model.path={tmp_path / 'gpt2-tiny'}",
        "data=jsonl_classification",
        f"data.path={llm_files['data']}",
        f"data.tokenizer={llm_files['tokenizer']}",
        "data.text_column=instruction",
        "data.label_column=user",  # four users: four classes
        "data.user_column=user",
        "partition=natural",
        "clients_per_round=2",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    with warnings_on_stderr():
        done = run_cli([*classifier, "adapter=lora", "adapter.target_modules=[nope]"])
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("fedsim: error: adapter.target_modules=['nope']: ")  # PEFT's reason follows
    assert "score.weight" in (tmp_path / "run" / "run.log").read_text()  # the newly initialised head, reported
    assert (list(library.handlers), library.propagate) == before  # put back for whatever this process does next
