"""What the forkserver also imports when the run's model is a Hugging Face one (``model=hf_causal_lm`` or
``hf_seq_cls``, e.g. ``experiment=lora_tiny``): ``transformers`` (its GPT-2 and the Auto classes) and PEFT's LoRA,
~3.5 CPU s that every process worker otherwise spent on its own before building its model (the build itself then
takes milliseconds for lora_tiny). Imports only, as in :mod:`fedsim.executor.process.preload`; a package that is
not installed is skipped (the run then refuses the model in one line, in the main process)."""

from __future__ import annotations

import contextlib
import importlib

MODULES = (
    "transformers",
    "transformers.models.auto.modeling_auto",
    "transformers.models.gpt2.modeling_gpt2",
    "peft",
    "peft.tuners.lora",
    "fedsim.models.hf_lm",
)

for _name in MODULES:
    with contextlib.suppress(ImportError):
        importlib.import_module(_name)
