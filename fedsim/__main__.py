"""``python -m fedsim``: run the Hydra-configured experiment."""

from fedsim.cli import main

if __name__ == "__main__":
    main()
