"""Drop-ins for torchtune's dataset builders that take ``packed``: one YAML line each.

Same names, same keys, same items as torchtune 0.6.1's builders; with
``packed: True`` they return :class:`~vecpack.torchtune.packed.PackedDataset`,
built on every core and cached::

    dataset:
      _component_: vecpack.torchtune.alpaca_dataset     # was torchtune.datasets.alpaca_dataset
      source: json
      data_files: data/alpaca.jsonl
      packed: True

How the rows become tokens::

    tokenizer family vecpack runs on a fast engine (Qwen2 / Qwen2.5, Llama 3, Mistral; text: Qwen, Llama 3)
        rows ──TorchtuneEncoder (the builder's message transform, reimplemented)──► packs
    any other tokenizer
        torchtune's own dataset (packed=False) ──ds[i] on every core──► packs

Either way the packs equal torchtune's pack for pack, except that every
document's first label is -100 (``PackedChatDataset``'s rule: the recipe's
row-wise label shift then never trains one document to predict the next).

``packed: False`` returns torchtune's own (unpacked) dataset. vecpack-only
keys, taken out before anything reaches ``load_dataset``: ``n_jobs``,
``cache_dir`` (vecpack's cache, not ``datasets``'), ``on_error``,
``progress``, and ``split_across_pack`` on the SFT builders (torchtune's
always pack them whole).

``cnn_dailymail_articles_dataset`` and ``wikitext_dataset`` are broken in
torchtune 0.6.1 (they pass ``max_seq_len`` on to ``load_dataset``, which
refuses it); here ``max_seq_len`` is what torchtune documents it as: the
length the texts are cut to (``max_seq_len - 1`` tokens, as
``TextCompletionDataset`` cuts at the tokenizer's) and, packed, the pack
length. Both also take ``packed``.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable

from vecpack.inputs.readers import sample_rows
from vecpack.inputs.sources import resolve_sources
from vecpack.options import check_max_len
from vecpack.tokenizing.backend import torchtune_family
from vecpack.torchtune.chat import _resolve_data
from vecpack.torchtune.encoder import TorchtuneEncoder
from vecpack.torchtune.packed import PackedDataset

__all__ = [
    "alpaca_cleaned_dataset", "alpaca_dataset", "cnn_dailymail_articles_dataset", "grammar_dataset",
    "instruct_dataset", "samsum_dataset", "slimorca_dataset", "text_completion_dataset", "wikitext_dataset",
]

_VECPACK_KEYS = ("n_jobs", "cache_dir", "on_error", "progress")
_NO_MAX_SEQ_LEN = "PackedDataset requires a max_seq_len to be set on the tokenizer."  # torchtune's words


def _vecpack_options(kwargs: dict) -> dict:
    """vecpack's own keys, removed from the ``load_dataset`` keywords."""
    return {k: kwargs.pop(k) for k in _VECPACK_KEYS if k in kwargs}


def _pack(tokenizer, *, style: str, options: dict, source: str, split: str, filter_fn, kwargs: dict,
          split_across_pack: bool, unpacked: Callable[[], Any], vp: dict):
    """The packed dataset: rows on a fast engine when the tokenizer allows, else ``unpacked()``'s items."""
    max_seq_len = getattr(tokenizer, "max_seq_len", None)
    if max_seq_len is None:
        raise ValueError(_NO_MAX_SEQ_LEN)
    common = dict(max_seq_len=max_seq_len, split_across_pack=split_across_pack, mask_first_label=True, **vp)
    if torchtune_family(tokenizer, style) == "torchtune":
        return PackedDataset(unpacked(), **common)

    kwargs = dict(kwargs)
    data = _resolve_data(source, kwargs.pop("data_files", None), split, filter_fn, kwargs)
    encoder = TorchtuneEncoder(tokenizer, style=style, **options,
                               check_rows=lambda: sample_rows(resolve_sources(data), 64))
    return PackedDataset.from_rows(data, encoder, **common)


def _sft(tt_builder: str, tokenizer, *, style: str, options: dict, source: str, packed: bool, filter_fn,
         split: str, split_across_pack: bool, kwargs: dict, tt_kwargs: dict):
    import torchtune.datasets as ttd

    vp = _vecpack_options(kwargs)

    def unpacked():
        return getattr(ttd, tt_builder)(tokenizer, source=source, packed=False, filter_fn=filter_fn, split=split,
                                         **tt_kwargs, **kwargs)

    if not packed:
        return unpacked()
    return _pack(tokenizer, style=style, options=options, source=source, split=split, filter_fn=filter_fn,
                 kwargs=kwargs, split_across_pack=split_across_pack, unpacked=unpacked, vp=vp)


def instruct_dataset(tokenizer, *, source: str, column_map: dict | None = None, train_on_input: bool = False,
                     new_system_prompt: str | None = None, packed: bool = False, filter_fn: Callable | None = None,
                     split: str = "train", split_across_pack: bool = False, **load_dataset_kwargs: Any):
    """torchtune's ``instruct_dataset`` (``InputOutputToMessages``: columns ``input`` / ``output``)."""
    opts = dict(column_map=column_map, train_on_input=train_on_input, new_system_prompt=new_system_prompt)
    return _sft("instruct_dataset", tokenizer, style="input_output", options=opts, source=source, packed=packed,
                filter_fn=filter_fn, split=split, split_across_pack=split_across_pack,
                kwargs=load_dataset_kwargs, tt_kwargs=opts)


def alpaca_dataset(tokenizer, *, source: str = "tatsu-lab/alpaca", column_map: dict | None = None,
                   train_on_input: bool = True, packed: bool = False, filter_fn: Callable | None = None,
                   split: str = "train", split_across_pack: bool = False, **load_dataset_kwargs: Any):
    """torchtune's ``alpaca_dataset`` (``AlpacaToMessages``: ``instruction``, ``input``, ``output``)."""
    opts = dict(column_map=column_map, train_on_input=train_on_input)
    return _sft("alpaca_dataset", tokenizer, style="alpaca", options=opts, source=source, packed=packed,
                filter_fn=filter_fn, split=split, split_across_pack=split_across_pack,
                kwargs=load_dataset_kwargs, tt_kwargs=opts)


alpaca_cleaned_dataset = functools.partial(alpaca_dataset, source="yahma/alpaca-cleaned")
alpaca_cleaned_dataset.__doc__ = ("torchtune's ``alpaca_cleaned_dataset``: :func:`alpaca_dataset` of "
                                  "``yahma/alpaca-cleaned``.")


def slimorca_dataset(tokenizer, *, source: str = "Open-Orca/SlimOrca-Dedup", column_map: dict | None = None,
                     train_on_input: bool = False, new_system_prompt: str | None = None, packed: bool = False,
                     filter_fn: Callable | None = None, split: str = "train", split_across_pack: bool = False,
                     **load_dataset_kwargs: Any):
    """torchtune's ``slimorca_dataset`` (``ShareGPTToMessages``: column ``conversations``)."""
    opts = dict(column_map=column_map, train_on_input=train_on_input, new_system_prompt=new_system_prompt)
    return _sft("slimorca_dataset", tokenizer, style="sharegpt", options=opts, source=source, packed=packed,
                filter_fn=filter_fn, split=split, split_across_pack=split_across_pack,
                kwargs=load_dataset_kwargs, tt_kwargs=opts)


def samsum_dataset(tokenizer, *, source: str = "Samsung/samsum", column_map: dict | None = None,
                   train_on_input: bool = False, new_system_prompt: str | None = None, packed: bool = False,
                   filter_fn: Callable | None = None, split: str = "train", split_across_pack: bool = False,
                   **load_dataset_kwargs: Any):
    """torchtune's ``samsum_dataset`` (``InputOutputToMessages`` over ``dialogue`` / ``summary``)."""
    opts = dict(column_map=column_map or {"input": "dialogue", "output": "summary"},
                train_on_input=train_on_input, new_system_prompt=new_system_prompt)
    return _sft("samsum_dataset", tokenizer, style="input_output", options=opts, source=source, packed=packed,
                filter_fn=filter_fn, split=split, split_across_pack=split_across_pack,
                kwargs=load_dataset_kwargs, tt_kwargs=opts)


def grammar_dataset(tokenizer, *, source: str = "liweili/c4_200m", column_map: dict | None = None,
                    train_on_input: bool = False, new_system_prompt: str | None = None, packed: bool = False,
                    filter_fn: Callable | None = None, split: str = "train", split_across_pack: bool = False,
                    **load_dataset_kwargs: Any):
    """torchtune's ``grammar_dataset`` (``InputOutputToMessages``: columns ``input`` / ``output``)."""
    opts = dict(column_map=column_map, train_on_input=train_on_input, new_system_prompt=new_system_prompt)
    return _sft("grammar_dataset", tokenizer, style="input_output", options=opts, source=source, packed=packed,
                filter_fn=filter_fn, split=split, split_across_pack=split_across_pack,
                kwargs=load_dataset_kwargs, tt_kwargs=opts)


def text_completion_dataset(tokenizer, source: str, column: str = "text", add_eos: bool = True,
                            packed: bool = False, split_across_pack: bool = True, split: str = "train",
                            filter_fn: Callable | None = None, **load_dataset_kwargs: Any):
    """torchtune's ``text_completion_dataset`` (``TextCompletionDataset``: labels = tokens)."""
    from torchtune.datasets import TextCompletionDataset

    vp = _vecpack_options(load_dataset_kwargs)

    def unpacked():
        return TextCompletionDataset(tokenizer=tokenizer, source=source, column=column, add_eos=add_eos,
                                     split=split, filter_fn=filter_fn, **load_dataset_kwargs)

    if not packed:
        return unpacked()
    return _pack(tokenizer, style="text", options=dict(column=column, add_eos=add_eos), source=source,
                 split=split, filter_fn=filter_fn, kwargs=load_dataset_kwargs,
                 split_across_pack=split_across_pack, unpacked=unpacked, vp=vp)


def _with_max_seq_len(tokenizer, max_seq_len: int | None, packed: bool):
    """``tokenizer``, or a shallow copy cut at ``max_seq_len`` (what cnn / wikitext's argument means)."""
    if max_seq_len is None:
        return tokenizer
    if not packed:
        raise ValueError("max_seq_len= is applied by vecpack to packed datasets only (torchtune 0.6.1 passes it "
                         "to load_dataset, which fails); set tokenizer.max_seq_len to cut unpacked texts")

    tok = copy.copy(tokenizer)
    tok.max_seq_len = check_max_len(max_seq_len, "max_seq_len")
    return tok


def cnn_dailymail_articles_dataset(tokenizer, source: str = "ccdv/cnn_dailymail", max_seq_len: int | None = None,
                                   packed: bool = False, split_across_pack: bool = True,
                                   filter_fn: Callable | None = None, split: str = "train",
                                   **load_dataset_kwargs: Any):
    """torchtune's ``cnn_dailymail_articles_dataset`` (the ``article`` column, config ``3.0.0``), fixed.

    ``max_seq_len`` (packed only) replaces the tokenizer's: texts are cut to
    ``max_seq_len - 1`` tokens and packs are ``max_seq_len`` long.
    """
    tok = _with_max_seq_len(tokenizer, max_seq_len, packed)
    return text_completion_dataset(tok, source=source, column="article", packed=packed,
                                   split_across_pack=split_across_pack, split=split, filter_fn=filter_fn,
                                   name="3.0.0", **load_dataset_kwargs)


def wikitext_dataset(tokenizer, source: str = "EleutherAI/wikitext_document_level", subset: str = "wikitext-103-v1",
                     max_seq_len: int | None = None, packed: bool = False, filter_fn: Callable | None = None,
                     split: str = "train", split_across_pack: bool = True, **load_dataset_kwargs: Any):
    """torchtune's ``wikitext_dataset`` (the ``page`` column of ``subset``), fixed.

    ``max_seq_len`` (packed only) replaces the tokenizer's, as for
    :func:`cnn_dailymail_articles_dataset`.
    """
    tok = _with_max_seq_len(tokenizer, max_seq_len, packed)
    return text_completion_dataset(tok, source=source, column="page", packed=packed,
                                   split_across_pack=split_across_pack, split=split, filter_fn=filter_fn,
                                   name=subset, **load_dataset_kwargs)
