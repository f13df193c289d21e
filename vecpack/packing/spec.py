"""``PackSpec``: how documents become packs, validated once by :mod:`vecpack.options`.

The pack part of a request (:mod:`vecpack.pipeline.request`), and what
:func:`vecpack.pack` validates its keywords with. Each field's role (in the
cache key, or applied on read) is declared next to it (:mod:`vecpack.options`).

>>> PackSpec.make(4096, strategy="ffd")
PackSpec(max_len=4096, strategy='ffd', long='truncate', shuffle_seed=0, prefix_sharing=False, pad_to_multiple_of=1, \
pad_id=None, ignore_index=-100)
"""

from __future__ import annotations

import dataclasses

from vecpack.options import IGNORE_INDEX, check_max_len, check_options, check_pad_multiple, key_fields, read

__all__ = ["PackSpec"]

_UNITS = {"pair": "preference pairs", "images": "documents with images", "turns": "per-turn conversations"}


@dataclasses.dataclass(frozen=True)
class PackSpec:
    """How documents become packs (see :func:`vecpack.plan` and :func:`vecpack.pack`).

    Attributes:
        max_len: tokens per pack.
        strategy: ``bfd``, ``ffd`` or ``greedy``.
        long: what happens to a document longer than ``max_len``.
        shuffle_seed: seeds the order of the packs (None: unshuffled).
        prefix_sharing: preference pairs only: each pair's prompt stored once.
        pad_to_multiple_of: each document counts as its length rounded up to this multiple when
            planned (context parallelism; see :func:`vecpack.plan`); 1: none, and then it is left out
            of the plan key, so plans cached before it existed still hit.
        pad_id: padding id (None: the tokenizer's pad token, else 0); applied on read.
        ignore_index: label of padding and of untrained tokens; applied on read.
    """

    max_len: int
    strategy: str = "bfd"
    long: str = "truncate"
    shuffle_seed: int | None = 0
    prefix_sharing: bool = False
    pad_to_multiple_of: int = 1
    pad_id: int | None = read(None)
    ignore_index: int = read(IGNORE_INDEX)

    @classmethod
    def make(cls, max_len, *, strategy: str = "bfd", long: str = "truncate", shuffle_seed: int | None = 0,
             prefix_sharing: bool = False, pad_id: int | None = None, ignore_index: int = IGNORE_INDEX,
             unit: str = "document") -> "PackSpec":
        """Validated; ``unit``: what is packed whole, ``"document"``, ``"pair"`` (preference pairs: never
        split, prompts may be shared), ``"images"`` (documents with images: never split) or ``"turns"`` (a
        conversation's per-turn documents, one trie: never split)."""
        pairs = unit == "pair"
        max_len = check_max_len(max_len)
        checked = check_options(strategy=strategy, long=long, shuffle_seed=shuffle_seed)
        if pairs:
            check_options(pair_long=long)
        if unit == "images":
            check_options(vision_long=long)
        if unit == "turns":
            check_options(turn_long=long)
        if prefix_sharing and not pairs:
            raise ValueError("prefix_sharing=True needs style='preference'")
        return cls(max_len, strategy, long, checked["shuffle_seed"], bool(prefix_sharing), 1, pad_id, ignore_index)

    def padded(self, pad_to_multiple_of: int, unit: str = "document") -> "PackSpec":
        """This spec with ``pad_to_multiple_of`` (validated: it divides ``max_len``; chat documents only).

        >>> PackSpec.make(4096).padded(8).pad_to_multiple_of
        8
        """
        multiple = check_pad_multiple(pad_to_multiple_of, self.max_len)
        if multiple > 1 and unit != "document":
            raise ValueError(f"pad_to_multiple_of={multiple} is supported for chat documents only, not for "
                             f"{_UNITS[unit]} yet; leave pad_to_multiple_of=1")
        return dataclasses.replace(self, pad_to_multiple_of=multiple)

    def plan_key(self) -> dict:
        """The key fields as the plan entries store them (``shuffle_seed`` a plain int)."""
        out = key_fields(self)
        out["shuffle_seed"] = None if self.shuffle_seed is None else int(self.shuffle_seed)
        if out["pad_to_multiple_of"] == 1:  # unpadded: the key it had before the option existed
            del out["pad_to_multiple_of"]
        return out
