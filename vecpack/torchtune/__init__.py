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

These names import torch and torchtune on first use; the encoder modules
(what worker processes load) need neither.
"""

from vecpack._lazy import lazy_names

# name -> the module that defines it, imported on first use
_LAZY = {
    "ChatDataset": "vecpack.torchtune.chat",
    "PackedChatDataset": "vecpack.torchtune.chat",
    "PackedDataset": "vecpack.torchtune.packed",
    **{name: "vecpack.torchtune.packed" for name in (
        "alpaca_cleaned_dataset", "alpaca_dataset", "cnn_dailymail_articles_dataset", "grammar_dataset",
        "instruct_dataset", "samsum_dataset", "slimorca_dataset", "text_completion_dataset", "wikitext_dataset")},
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_names("vecpack.torchtune", _LAZY, globals())
