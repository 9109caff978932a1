"""What ``python -m fedsim`` reads of its command line before anything else (fedsim/cli/config_dir.py): the model
options it names, directly or through an experiment preset of conf/experiment, to start the workers' forkserver
with a Hugging Face model's imports."""

from __future__ import annotations

from pathlib import Path

from fedsim.cli.config_dir import config_dir, model_options


def test_the_config_dir_is_the_checkouts_conf() -> None:
    assert Path(config_dir()) == Path(__file__).resolve().parents[2] / "conf"


def test_model_options_are_read_from_the_arguments_and_the_experiment_presets() -> None:
    assert model_options(["experiment=lora_tiny", "executor=process"]) == {"hf_causal_lm"}
    assert model_options(["model=hf_seq_cls,mlp", "num_rounds=2"]) == {"hf_seq_cls", "mlp"}
    assert model_options(["+model=cnn"]) == {"cnn"}
    assert model_options(["executor=process"]) == set()
    assert model_options(["experiment=no_such_preset"]) == set()


def test_every_preset_that_overrides_the_model_is_read() -> None:
    """Each preset's model, as its file states it, is what model_options finds (the regular expression keeps up
    with the presets' format)."""
    for preset in sorted((Path(config_dir()) / "experiment").glob("*.yaml")):
        stated = {
            line.split(":", 1)[1].strip()
            for line in preset.read_text().splitlines()
            if line.strip().startswith("- override /model:")
        }
        assert model_options([f"experiment={preset.stem}"]) == stated, preset.name
