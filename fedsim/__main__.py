"""``python -m fedsim`` and the ``fedsim`` command: run the Hydra-configured experiment (see fedsim/cli/command.py)."""

import sys


def main() -> None:
    """Start the process workers' forkserver first when the command line asks for them (its imports then overlap
    with this process's own; with a Hugging Face model's, too), then hand over to the command line proper."""
    from fedsim.cli.config_dir import model_options
    from fedsim.executor.process.forkserver import start_early

    start_early(sys.argv[1:], hf_model=any(m.startswith("hf_") for m in model_options(sys.argv[1:])))
    from fedsim.cli.command import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
