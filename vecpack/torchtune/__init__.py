"""torchtune drop-ins: name them in a config's ``_component_``.

* :class:`PackedDataset` (also ``vecpack.PackedDataset``): torchtune's
  ``PackedDataset`` for any map-style dataset, its items made on every core.
* The builders that take ``packed`` (``alpaca_dataset``,
  ``alpaca_cleaned_dataset``, ``instruct_dataset``, ``slimorca_dataset``,
  ``samsum_dataset``, ``grammar_dataset``, ``text_completion_dataset``,
  ``cnn_dailymail_articles_dataset``, ``wikitext_dataset``): the same keys,
  ``_component_: vecpack.torchtune.alpaca_dataset``.
* :class:`PackedChatDataset` (also ``vecpack.PackedChatDataset``): torchtune's
  ``chat_dataset(packed=True)``, tokenized on every core, packed and cached.
* :class:`ChatDataset`: the same rows unpacked (``packed=False``).

This package imports torch and torchtune.
"""

from vecpack.torchtune.builders import alpaca_cleaned_dataset as alpaca_cleaned_dataset
from vecpack.torchtune.builders import alpaca_dataset as alpaca_dataset
from vecpack.torchtune.builders import cnn_dailymail_articles_dataset as cnn_dailymail_articles_dataset
from vecpack.torchtune.builders import grammar_dataset as grammar_dataset
from vecpack.torchtune.builders import instruct_dataset as instruct_dataset
from vecpack.torchtune.builders import samsum_dataset as samsum_dataset
from vecpack.torchtune.builders import slimorca_dataset as slimorca_dataset
from vecpack.torchtune.builders import text_completion_dataset as text_completion_dataset
from vecpack.torchtune.builders import wikitext_dataset as wikitext_dataset
from vecpack.torchtune.chat import ChatDataset as ChatDataset
from vecpack.torchtune.chat import PackedChatDataset as PackedChatDataset
from vecpack.torchtune.packed import PackedDataset as PackedDataset

__all__ = [
    "ChatDataset", "PackedChatDataset", "PackedDataset", "alpaca_cleaned_dataset", "alpaca_dataset",
    "cnn_dailymail_articles_dataset", "grammar_dataset", "instruct_dataset", "samsum_dataset",
    "slimorca_dataset", "text_completion_dataset", "wikitext_dataset",
]
