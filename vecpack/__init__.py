"""vecpack: tokenize and pack chat fine-tuning data on every core.

The public API. Data flows top to bottom::

    formats -> template/encoder -> pool -> tokenize   (flat int32 arrays)
    plan (numba kernels) -> pack                      (attention-ready packs)
    cache -> build / load                             (content-addressed, mmapped)
    collate, torchtune, streaming, cli                (front doors)

>>> import numpy as np, vecpack
>>> tokens = np.arange(1, 8, dtype=np.int32)
>>> offsets = np.array([0, 3, 5, 7], dtype=np.int64)
>>> packed = vecpack.pack(tokens, offsets, max_len=4, strategy="greedy")
>>> len(packed)
2

Names that need torch (collators, datasets) are imported lazily, so
``import vecpack`` stays light.
"""

from ._version import __version__ as __version__
from .errors import InputError as InputError
from .errors import VecpackError as VecpackError
from .errors import WorkerDiedError as WorkerDiedError
from .plan import Plan as Plan
from .plan import plan as plan
from .packed import Packed as Packed
from .packed import pack as pack
from .tokenize import Tokenized as Tokenized
from .tokenize import tokenize as tokenize
from .build import build as build
from .build import load as load
from .build import save as save

# Lazily imported: these pull in torch.
_LAZY = {
    "FlexBatch": "vecpack.collate",
    "PackedChatDataset": "vecpack.torchtune",
    "StreamingPackedDataset": "vecpack.streaming",
    "collate_flash": "vecpack.collate",
    "collate_flex": "vecpack.collate",
    "collate_torchtune": "vecpack.collate",
}

__all__ = sorted([
    "FlexBatch", "InputError", "Packed", "PackedChatDataset", "Plan", "StreamingPackedDataset", "Tokenized",
    "VecpackError", "WorkerDiedError", "__version__", "build", "collate_flash", "collate_flex",
    "collate_torchtune", "load", "pack", "plan", "save", "tokenize",
])


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'vecpack' has no attribute {name!r}")


def __dir__():
    return __all__
