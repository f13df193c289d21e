"""Preference pairs for DPO-style training: read, tokenized as TRL does, packed pair by pair.

::

    rows (TRL / axolotl / LLaMA-Factory forms) ──formats──► Pair(prompt, chosen, rejected)
        ──encoder (chat template, fast engines)──► prompt_ids, chosen_ids, rejected_ids   (== TRL's)
        ──packed (a pair is one unit; kernels lay it out)──► PackedPairs
        ──collate──► flat batch + sequence / pair / completion indices ──logps, loss──► DPO

The modules, each imported on its own (this package imports nothing heavy):

* :mod:`vecpack.chat.pairs`: recognise a row's form and read it as a :class:`~vecpack.chat.pairs.Pair`.
* :mod:`vecpack.tokenizing.pairs`: :class:`~vecpack.tokenizing.pairs.PairEncoder`, token for token TRL's
  ``DPOTrainer`` preparation, on the engines and pool every chat row uses.
* :mod:`vecpack.packing.pairs`: :func:`~vecpack.packing.pairs.pack_pairs` -> ``PackedPairs``.
* :mod:`vecpack.integrations.collate`: :func:`~vecpack.integrations.collate.collate_preference`, its masks.
* :mod:`vecpack.preference.logps`: :func:`~vecpack.preference.logps.sequence_logps`.
* :mod:`vecpack.preference.loss`: :func:`~vecpack.preference.loss.dpo_loss` (TRL's default sigmoid loss).

See ``docs/preference.md``.
"""
