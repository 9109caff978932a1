"""The flat parameter vector, kept at this path for researchers' code: defined in :mod:`fedsim.core.params`."""

from fedsim.core.params import ParamLayout, fixed_state, flatten, load_flat, restore_fixed_state

__all__ = ["ParamLayout", "fixed_state", "flatten", "load_flat", "restore_fixed_state"]
