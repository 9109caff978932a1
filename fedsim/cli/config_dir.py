"""Where ``conf/`` is, and what a command line asks of it, read without composing it (nor importing torch or Hydra):
``python -m fedsim`` asks this before anything else to start the process workers' forkserver with the right imports.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

_MODEL_OVERRIDE = re.compile(r"^\s*-\s*override\s+/model:\s*(\S+)\s*$", re.M)


def config_dir() -> str:
    """``conf/`` of the checkout this module runs from, else the copy a non-editable install put under
    ``<prefix>/share/fedsim/conf`` (setup.cfg's data_files; the prefix of this interpreter, or the one
    the package was installed into with ``--prefix`` / ``--user``)."""
    package = Path(__file__).resolve().parent.parent  # fedsim/, this module being fedsim/cli/config_dir.py
    candidates = [
        package.parent / "conf",
        Path(sys.prefix) / "share" / "fedsim" / "conf",
        package.parents[3] / "share" / "fedsim" / "conf" if len(package.parents) > 3 else package,
    ]
    found = next((c for c in candidates if (c / "config.yaml").exists()), candidates[0])
    return str(found)


def model_options(argv: Sequence[str]) -> set[str]:
    """The ``model`` options the command line ``argv`` names: ``model=a,b`` directly, or through the
    ``override /model: ...`` of an ``experiment=...`` preset in ``conf/experiment``. A guess for start-up only (an
    unreadable preset names none); the composed configuration decides what the run builds."""
    found: set[str] = set()
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "model":
            found.update(value.split(","))
        elif key == "experiment":
            for name in value.split(","):
                try:
                    text = (Path(config_dir()) / "experiment" / f"{name}.yaml").read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                found.update(_MODEL_OVERRIDE.findall(text))
    return found
