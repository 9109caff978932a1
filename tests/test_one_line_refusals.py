"""The battery's rule, kept (issue #41): every refusal is exactly one line, for every new option.

Each case is a bad value of an option added by issues #32-#35 and #43 (pFedMe, APFL, FedSA-LoRA, LoRA and FFA-LoRA
adapters, the Hugging Face models, the text data options, clip-only DP-SGD, the PLD accountant, Ray's kept actors,
local steps, learning-rate schedules, Per-FedAvg, MOON),
run from the command line: exit status 2, one line on stderr, ``fedsim: error: ...`` naming the key (or the file
and field the value points at), nothing on stdout, and no file of the run left behind (only Hydra's ``.hydra/``
and ``run.log``). The data are tiny and every refusal comes before the first round. A refusal that cannot name its
key because it comes from the data's reader names the file and the field instead (fedsim/data)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_runner import run_cli, warnings_on_stderr

sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))  # tests/data: writers of the language-model files

import llm_files  # noqa: E402

SMALL = ["num_rounds=1", "data.num_devices=6", "clients_per_round=2"]
LM = ["model=hf_causal_lm", "model.hidden_size=16", "model.num_layers=1", "partition=natural", *SMALL[:1]]
SEQ_CLS = ["model=hf_seq_cls", "model.hidden_size=16", "model.num_layers=1", "model.vocab_size=40"]


def _bases(root: Path) -> dict[str, list[str]]:
    """The valid runs each case spoils with one override: tiny files written under ``root``."""
    synthetic_text = ["data=synthetic_text", "data.num_clients=4", "data.tokens_per_client=100", *LM]
    return {
        "small": SMALL,
        "synthetic_text": [*synthetic_text, "clients_per_round=2"],
        "instructions": [
            "data=jsonl_instructions",
            *llm_files.write_instructions(root / "instructions", 16, 4),
            *LM,
            "clients_per_round=2",
        ],
        "classification": [
            "data=jsonl_classification",
            *llm_files.write_classification(root / "classification", 16, 4),
            *SEQ_CLS,
            "partition=natural",
            *SMALL[:1],
            "clients_per_round=2",
        ],
        "corpus": ["data=text_corpus", *llm_files.write_corpus(root / "corpus"), *LM, "clients_per_round=2"],
        "language_model": [*LM, "clients_per_round=2"],
    }


# (case, base, overrides, what the line must name)
CASES = [
    ("pfedme-lam-0", "small", ["strategy=pfedme", "strategy.lam=0"], "strategy.lam must be > 0"),
    ("pfedme-lam-negative", "small", ["strategy=pfedme", "strategy.lam=-1"], "strategy.lam must be > 0"),
    ("pfedme-lam-text", "small", ["strategy=pfedme", "strategy.lam=abc"], "strategy.lam must be a number"),
    ("pfedme-personal-lr", "small", ["strategy=pfedme", "strategy.personal_lr=0"], "strategy.personal_lr"),
    ("pfedme-inner-steps", "small", ["strategy=pfedme", "strategy.inner_steps=0"], "strategy.inner_steps"),
    ("pfedme-inner-steps-float", "small", ["strategy=pfedme", "strategy.inner_steps=1.5"], "strategy.inner_steps"),
    ("pfedme-beta", "small", ["strategy=pfedme", "strategy.beta=0"], "strategy.beta"),
    ("pfedme-unknown-key", "small", ["strategy=pfedme", "+strategy.mu=1"], "unknown setting strategy.mu"),
    ("pfedme-vmap", "small", ["strategy=pfedme", "executor=vmap"], "executor=vmap"),
    ("apfl-alpha-above-1", "small", ["strategy=apfl", "strategy.alpha=1.5"], "strategy.alpha must be in [0, 1]"),
    ("apfl-alpha-negative", "small", ["strategy=apfl", "strategy.alpha=-0.1"], "strategy.alpha must be in [0, 1]"),
    ("apfl-adapt-alpha", "small", ["strategy=apfl", "strategy.adapt_alpha=maybe"], "strategy.adapt_alpha"),
    ("apfl-unknown-key", "small", ["strategy=apfl", "+strategy.lam=1"], "unknown setting strategy.lam"),
    ("fedsa-regex", "small", ["strategy=fedsa_lora", "strategy.personal_layers='['"], "strategy.personal_layers"),
    ("fedsa-unquoted", "small", ["strategy=fedsa_lora", "strategy.personal_layers=lora_[AB]"], "personal_layers"),
    ("fedsa-without-lora", "small", ["strategy=fedsa_lora"], "strategy=fedsa_lora needs a model with LoRA"),
    ("lora-r-0", "synthetic_text", ["adapter=lora", "adapter.r=0"], "adapter.r must be >= 1"),
    ("lora-alpha-negative", "synthetic_text", ["adapter=lora", "adapter.alpha=-1"], "adapter.alpha must be > 0"),
    ("lora-alpha-0", "synthetic_text", ["adapter=lora", "adapter.alpha=0"], "adapter.alpha must be > 0"),
    ("lora-dropout", "synthetic_text", ["adapter=lora", "adapter.dropout=1"], "adapter.dropout"),
    ("lora-train-a", "synthetic_text", ["adapter=lora", "adapter.train_a=maybe"], "adapter.train_a"),
    ("lora-unknown-key", "synthetic_text", ["adapter=lora", "+adapter.rank=4"], "unknown setting adapter.rank"),
    ("lora-on-logreg", "small", ["adapter=lora"], "adapter=lora needs a Hugging Face model"),
    ("ffa-r-0", "synthetic_text", ["adapter=ffa_lora", "adapter.r=0"], "adapter.r must be >= 1"),
    ("lm-num-layers", "synthetic_text", ["model.num_layers=0"], "model.num_layers must be >= 1"),
    ("lm-hidden-size", "synthetic_text", ["model.hidden_size=0"], "model.hidden_size must be >= 1"),
    ("lm-heads", "synthetic_text", ["model.num_heads=3"], "model.hidden_size (16) must be a multiple of model.num"),
    ("lm-model-type", "synthetic_text", ["model.model_type=nope"], "model.model_type=nope"),
    ("lm-dropout", "synthetic_text", ["model.dropout=2"], "model.dropout must be in [0, 1)"),
    ("lm-vocab", "synthetic_text", ["model.vocab_size=4"], "model.vocab_size=4"),
    ("lm-context", "synthetic_text", ["model.context_length=4"], "model.context_length=4"),
    ("lm-path", "synthetic_text", ["model.path=/nonexistent/gpt2"], "model.path=/nonexistent/gpt2"),
    ("lm-unknown-key", "synthetic_text", ["+model.foo=1"], "unknown setting model.foo"),
    ("lm-dtype", "synthetic_text", ["model.dtype=float64"], "model.dtype must be one of float32, bfloat16, float16"),
    ("lm-dtype-full-fine-tuning", "synthetic_text", ["model.dtype=bfloat16"], "adapter=none trains every weight"),
    ("lm-checkpointing", "synthetic_text", ["model.gradient_checkpointing=maybe"], "model.gradient_checkpointing"),
    ("client-autocast", "small", ["client.autocast=float32"], "client.autocast must be null, bfloat16 or float16"),
    ("vmap-autocast", "small", ["executor=vmap", "client.autocast=bfloat16"], "executor=vmap cannot apply client.aut"),
    ("dpsgd-autocast", "small", ["client=dpsgd", "+client.autocast=bfloat16"], "client.autocast: DP-SGD's per-exam"),
    ("seq-cls-vocab", "small", ["model=hf_seq_cls"], "model.vocab_size"),  # data without a token vocabulary
    ("seq-cls-pad", "classification", ["model.pad_token_id=-1"], "model.pad_token_id must be >= 0"),
    ("synthetic-text-vocab", "synthetic_text", ["data.vocab_size=1"], "data.vocab_size"),
    ("synthetic-text-alpha", "synthetic_text", ["data.alpha=2"], "data.alpha"),
    ("synthetic-text-seq-len", "synthetic_text", ["data.seq_len=0"], "data.seq_len"),
    ("synthetic-text-tokens", "synthetic_text", ["data.tokens_per_client=0"], "data.tokens_per_client"),
    ("synthetic-text-clients", "synthetic_text", ["data.num_clients=0"], "data.num_clients"),
    ("synthetic-text-concentration", "synthetic_text", ["data.concentration=0"], "data.concentration"),
    ("synthetic-text-test-fraction", "synthetic_text", ["data.test_fraction=1"], "data.test_fraction"),
    ("instructions-path", "instructions", ["data.path=/nonexistent/train.jsonl"], "/nonexistent/train.jsonl"),
    ("instructions-tokenizer", "instructions", ["data.tokenizer=/nonexistent/t.json"], "data.tokenizer"),
    ("instructions-seq-len", "instructions", ["data.seq_len=0"], "data.seq_len"),
    ("trained-tokenizer-kind", "instructions", ["data.tokenizer=train", "data.tokenizer_kind=spm"], "tokenizer_kind"),
    ("trained-tokenizer-vocab", "corpus", ["data.tokenizer=train", "data.vocab_size=100"], "data.vocab_size"),
    (
        "trained-tokenizer-words",
        "classification",
        ["data.tokenizer=train", "data.tokenizer_kind=word", "data.vocab_size=3"],
        "data.vocab_size",
    ),
    (
        "trained-tokenizer-shakespeare",
        "language_model",
        ["data=shakespeare_lm", "data.folder=/nonexistent", "data.tokenizer=train"],
        "data.tokenizer=train is for jsonl_instructions, jsonl_classification and text_corpus",
    ),
    ("instructions-test-fraction", "instructions", ["data.test_path=null", "data.test_fraction=1.5"], "test_fraction"),
    ("instructions-user-column", "instructions", ["data.user_column=nope"], "train.jsonl line 1 has no 'nope'"),
    (
        "instructions-category-column",
        "instructions",
        ["data.category_column=nope", "partition=dirichlet", "partition.num_clients=2"],
        "train.jsonl line 1 has no 'nope'",
    ),
    ("classification-label-column", "classification", ["data.label_column=nope"], "train.jsonl line 1 has no 'nope'"),
    ("classification-text-column", "classification", ["data.text_column=nope"], "train.jsonl line 1 has no 'nope'"),
    ("classification-seq-len", "classification", ["data.seq_len=0"], "data.seq_len"),
    ("corpus-path", "corpus", ["data.path=/nonexistent/corpus"], "data.path=/nonexistent/corpus"),
    ("corpus-document", "corpus", ["data.document=sentence"], "data.document"),
    ("corpus-seq-len", "corpus", ["data.seq_len=0"], "data.seq_len"),
    ("shakespeare-lm-folder", "language_model", ["data=shakespeare_lm", "data.folder=/nonexistent"], "/nonexistent"),
    ("dpsgd-noise", "small", ["client=dpsgd", "client.noise_multiplier=-1"], "client.noise_multiplier"),
    ("dp-accountant", "small", ["dp=central", "dp.accountant=xyz"], "dp.accountant"),
    ("ray-reuse-actors", "small", ["executor=ray", "executor.reuse_actors=maybe"], "executor.reuse_actors"),
    ("local-steps-0", "small", ["client.local_steps=0"], "client.local_steps must be an integer >= 1"),
    ("local-steps-float", "small", ["client.local_steps=2.5"], "client.local_steps must be an integer"),
    ("local-steps-text", "small", ["client.local_steps=abc"], "client.local_steps"),
    ("local-steps-clock", "small", ["client.local_steps=3", "clock=sampled"], "client.local_steps=3"),
    ("local-steps-dpsgd", "small", ["client=dpsgd", "+client.local_steps=3"], "client.local_steps: client=dpsgd"),
    ("lr-schedule-kind", "small", ["client.lr_schedule.kind=linear"], "client.lr_schedule.kind must be one of"),
    ("lr-schedule-gamma", "small", ["client.lr_schedule.gamma=0"], "client.lr_schedule.gamma must be in (0, 1]"),
    ("lr-schedule-gamma-text", "small", ["client.lr_schedule.gamma=abc"], "client.lr_schedule.gamma must be a"),
    ("lr-schedule-step-rounds", "small", ["client.lr_schedule.step_rounds=0"], "client.lr_schedule.step_rounds"),
    ("lr-schedule-min-lr", "small", ["client.lr_schedule.min_lr=-1"], "client.lr_schedule.min_lr"),
    ("lr-schedule-num-rounds", "small", ["client.lr_schedule.num_rounds=0"], "client.lr_schedule.num_rounds"),
    ("lr-schedule-unknown", "small", ["+client.lr_schedule.decay=2"], "unknown setting client.lr_schedule.decay"),
    ("perfedavg-alpha", "small", ["strategy=perfedavg", "strategy.alpha=0"], "strategy.alpha must be > 0"),
    ("perfedavg-beta", "small", ["strategy=perfedavg", "strategy.beta=-1"], "strategy.beta must be > 0 or null"),
    ("perfedavg-variant", "small", ["strategy=perfedavg", "strategy.variant=maml"], "strategy.variant must be fo or"),
    ("perfedavg-delta", "small", ["strategy=perfedavg", "strategy.delta=0"], "strategy.delta must be > 0"),
    ("perfedavg-vmap", "small", ["strategy=perfedavg", "executor=vmap"], "executor=vmap"),
    ("moon-mu", "small", ["strategy=moon", "model=mlp", "strategy.mu=-1"], "strategy.mu must be >= 0"),
    ("moon-temperature", "small", ["strategy=moon", "model=mlp", "strategy.temperature=0"], "strategy.temperature"),
    ("moon-logreg", "small", ["strategy=moon"], "strategy=moon contrasts the input of the model's last nn.Linear"),
    ("moon-vmap", "small", ["strategy=moon", "model=mlp", "executor=vmap"], "executor=vmap"),
    ("moon-dpsgd", "small", ["strategy=moon", "model=mlp", "client=dpsgd"], "has its own epoch loop"),
]
# refusals once the adapters are on the model (the first of them imports peft: seconds)
SLOW_CASES = [
    ("lora-vmap-dropout", "synthetic_text", ["executor=vmap", "adapter=lora", "adapter.dropout=0.1"], "dropout"),
    ("lora-target-module", "synthetic_text", ["adapter=lora", "adapter.target_modules=[nope]"], "target_modules"),
    ("ffa-target-module", "synthetic_text", ["adapter=ffa_lora", "adapter.target_modules=[nope]"], "target_modules"),
    (
        "vmap-checkpointing",
        "synthetic_text",
        ["executor=vmap", "adapter=lora", "model.gradient_checkpointing=true"],
        "executor=vmap cannot run gradient checkpointing",
    ),
    (
        "dpsgd-checkpointing",
        "synthetic_text",
        ["client=dpsgd", "adapter=lora", "model.gradient_checkpointing=true"],
        "client=dpsgd cannot use gradient checkpointing",
    ),
]


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    return _bases(tmp_path_factory.mktemp("files"))


def _assert_one_line_refusal(args: list[str], names: str, run_dir: Path) -> None:
    with warnings_on_stderr():  # a library's warning would be a second line
        done = run_cli([*args, f"hydra.run.dir={run_dir}"])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and done.stdout == "", (done.stderr, done.stdout)
    assert lines[0].startswith("fedsim: error: ") and names in lines[0], lines[0]
    left = {path.name for path in run_dir.iterdir()} if run_dir.exists() else set()
    assert left <= {".hydra", "run.log"}, left  # no metrics.jsonl, summary.json, checkpoints or tensorboard/


@pytest.mark.parametrize(("case", "base", "overrides", "names"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_value_of_a_new_option_is_one_line(
    case: str, base: str, overrides: list[str], names: str, bases: dict[str, list[str]], tmp_path: Path
) -> None:
    _assert_one_line_refusal([*bases[base], *overrides, "logger.progress=false"], names, tmp_path / "run")


@pytest.mark.slow
@pytest.mark.parametrize(("case", "base", "overrides", "names"), SLOW_CASES, ids=[c[0] for c in SLOW_CASES])
def test_a_bad_adapter_on_the_model_is_one_line(
    case: str, base: str, overrides: list[str], names: str, bases: dict[str, list[str]], tmp_path: Path
) -> None:
    _assert_one_line_refusal([*bases[base], *overrides, "logger.progress=false"], names, tmp_path / "run")
