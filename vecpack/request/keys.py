"""Every cache key of a build, from its request, in one place.

A key holds the request's fields whose role is ``"key"``
(:mod:`vecpack._fields`), the content hashes of the data and the
tokenizer (:mod:`vecpack.store.fingerprint`), and a format number per kind of
entry. Paths, ``n_jobs``, ``progress`` and the executor are never in it.

::

    corpus-<key>  data content, tokenizer content, ChatSpec, RunSpec.on_error, CORPUS_FORMAT
    plan-<key>    the corpus key, PackSpec (max_len, strategy, long, shuffle_seed, prefix_sharing)
    pairs-<key>   the same, for preference pairs
    turns-<key>   the same, for per-turn tries (ChatSpec.per_turn; its corpus key differs too)
    mix-<key>     the corpus keys, the weights, PackSpec, MixSpec
"""

from __future__ import annotations

import pathlib

from vecpack._fields import key_fields
from vecpack.store import hashing
from vecpack.store.fingerprint import CORPUS_FORMAT, data_fingerprint, describe, tokenizer_fingerprint

__all__ = ["MIX_FORMAT", "PAIR_PLAN_FORMAT", "PLAN_FORMAT", "corpus_key", "mix_key", "plan_key"]

#: Bump when plans change for the same lengths and options (2: the key names every PackSpec key field).
PLAN_FORMAT = 2
#: Bump when pair plans change for the same lengths and options.
PAIR_PLAN_FORMAT = 1
#: Bump when mixed plans change for the same corpora and options (2: as PLAN_FORMAT).
MIX_FORMAT = 2


def corpus_key(inp, tok, run, *, root=None, on_read=None) -> tuple[dict, dict]:
    """(key inputs, readable description) of one input's tokenized corpus.

    Args:
        inp: a resolved :class:`~vecpack.request.request.Input`.
        tok: the request's :class:`~vecpack.request.specs.TokenizerSpec`.
        run: the request's :class:`~vecpack.request.specs.RunSpec` (``verify``: re-hash the files).
        root: where the file-hash memo lives (default: the default cache).
        on_read: called with the bytes about to be read to hash files the memo does not know.
    """
    root = pathlib.Path(root) if root is not None else hashing.default_root()
    data, names = data_fingerprint(inp.files, root, run.verify, on_read)
    inputs = {"format": CORPUS_FORMAT, "data": data,
              "tokenizer": tokenizer_fingerprint(tok.keyed, root=root, verify=run.verify),
              **key_fields(inp.chat), **key_fields(run)}
    return inputs, describe(names, tok.tokenizer, tok.encoder)


def plan_key(pack, corpus: str, *, pairs: bool) -> tuple[str, dict]:
    """(entry kind, key inputs) of the plan of one corpus: ``"plan"``, or ``"pairs"`` for preference pairs."""
    return ("pairs" if pairs else "plan",
            {"format": PAIR_PLAN_FORMAT if pairs else PLAN_FORMAT, "corpus": corpus, **pack.plan_key()})


def mix_key(pack, mix, corpora: list, weights: list) -> dict:
    """The key inputs of a mixture's plan: no paths, no names."""
    return {"format": MIX_FORMAT, "corpora": list(corpora), "weights": [float(w) for w in weights],
            **pack.plan_key(), **{k: v for k, v in mix.as_kwargs().items()}}
