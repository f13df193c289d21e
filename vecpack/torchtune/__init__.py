"""torchtune drop-ins: name them in a config's ``_component_``.

* :class:`PackedChatDataset` (also ``vecpack.PackedChatDataset``): torchtune's
  ``chat_dataset(packed=True)``, tokenized on every core, packed and cached.
* :class:`ChatDataset`: the same rows unpacked (``packed=False``).

This package imports torch and torchtune.
"""

from vecpack.torchtune.chat import ChatDataset as ChatDataset
from vecpack.torchtune.chat import PackedChatDataset as PackedChatDataset

__all__ = ["ChatDataset", "PackedChatDataset"]
