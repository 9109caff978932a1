"""What crosses the wire: update codecs each way and the byte ledger (docs/communication.md).

Configured by ``compression=<option>`` (``conf/compression/``); :class:`Compression` from Python.
"""

from fedsim.comm.codecs import BFloat16, Float16, Selection, Sparsifier, ValueCodec
from fedsim.comm.pipeline import Chain, Compression
from fedsim.comm.qsgd import QSGD
from fedsim.comm.sparsify import RandomMask, TopK

__all__ = [
    "BFloat16",
    "Chain",
    "Compression",
    "Float16",
    "QSGD",
    "RandomMask",
    "Selection",
    "Sparsifier",
    "TopK",
    "ValueCodec",
]
