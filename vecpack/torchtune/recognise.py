"""What vecpack recognises in a torchtune dataset: rows it can tokenize itself, items it can key.

:func:`recognise` says when a torchtune ``SFTDataset`` / ``TextCompletionDataset``
can skip ``ds[i]`` altogether (its message transform and tokenizer are
reimplemented by :class:`~vecpack.torchtune.encoder.TorchtuneEncoder`), and
:func:`items_fingerprint` when its items can be cached (torchtune's own
classes over a ``datasets.Dataset``: the transform's settings and the
tokenizer's; the table's content is keyed by the caller).
"""

from __future__ import annotations

import hashlib
import pickle

from vecpack.tokenizing.backend import torchtune_family
from vecpack.torchtune.encoder import _content_digest

__all__ = ["items_fingerprint", "recognise"]

_FINGERPRINT_VERSION = "vecpack-tt-items-1"


def _hf_dataset(data) -> bool:
    return type(data).__name__ == "Dataset" and (type(data).__module__ or "").startswith("datasets")


def _columns(data) -> set:
    return set(getattr(data, "column_names", None) or ())


def _sft_parts(ds):
    """(message transform, tokenizer, data) of a plain torchtune ``SFTDataset``, else None."""
    from torchtune.datasets import SFTDataset
    from torchtune.datasets._sft import SFTTransform

    if type(ds) is not SFTDataset or not _hf_dataset(getattr(ds, "_data", None)):
        return None
    prep = getattr(ds, "_prepare_sample", None)
    if (type(prep) is not SFTTransform or prep._message_transform is not ds._message_transform
            or prep._model_transform is not ds._model_transform):
        return None
    return ds._message_transform, ds._model_transform, ds._data


def _text_parts(ds):
    from torchtune.datasets import TextCompletionDataset

    if type(ds) is not TextCompletionDataset or not _hf_dataset(getattr(ds, "_data", None)):
        return None
    return ds._tokenizer, ds._data


def _transform_options(mt, columns: set) -> dict | None:
    """TorchtuneEncoder options that reproduce torchtune's message transform ``mt`` (None: not text-only)."""
    from torchtune.data import AlpacaToMessages, InputOutputToMessages, OpenAIToMessages, ShareGPTToMessages

    kind = type(mt)
    if kind is AlpacaToMessages:
        return dict(style="alpaca", train_on_input=mt.train_on_input, column_map=mt.column_map,
                    template=dict(mt.template))
    if kind is InputOutputToMessages:
        if mt.image_dir is not None or "image" in columns or mt.column_map.get("image") in columns:
            return None
        return dict(style="input_output", train_on_input=mt.train_on_input, column_map=mt.column_map,
                    new_system_prompt=mt.new_system_prompt)
    if kind is ShareGPTToMessages:
        cmap = mt._column_map
        if mt.image_dir is not None or "image" in columns or cmap.get("image") in columns:
            return None
        return dict(style="sharegpt", column=cmap["conversations"], train_on_input=mt.train_on_input,
                    new_system_prompt=mt.new_system_prompt)
    if kind is OpenAIToMessages:
        return dict(style="openai", column=mt._column_map["messages"], train_on_input=mt.train_on_input,
                    new_system_prompt=mt.new_system_prompt)
    return None


def recognise(ds):
    """``(tokenizer, encoder options, datasets.Dataset)`` when vecpack reproduces ``ds[i]`` on its own.

    True for torchtune's ``SFTDataset`` with one of torchtune's text message
    transforms, and ``TextCompletionDataset``, over a tokenizer family that
    :class:`~vecpack.torchtune.encoder.TorchtuneEncoder` runs on a fast engine.
    None otherwise (the items are then read with ``ds[i]``).
    """

    try:
        sft, text = _sft_parts(ds), _text_parts(ds)
    except ImportError:  # pragma: no cover - torchtune's layout changed
        return None
    if sft is not None:
        mt, tok, data = sft
        options = _transform_options(mt, _columns(data))
    elif text is not None:
        tok, data = text
        options = dict(style="text", column=ds._column, add_eos=ds.add_eos)
    else:
        return None
    if options is None or torchtune_family(tok, options["style"]) == "torchtune":
        return None
    return tok, options, data


def _settings(obj) -> bytes:
    """A stable digest input of an object's settings (its class and attributes)."""
    items = sorted((k, v) for k, v in vars(obj).items() if not k.startswith("__"))
    try:
        blob = pickle.dumps(items, protocol=4)
    except Exception:
        blob = repr(items).encode()
    return f"{type(obj).__module__}.{type(obj).__qualname__}\0".encode() + blob


def items_fingerprint(ds) -> str | None:
    """A digest of what decides ``ds``'s items, when vecpack can tell (else None: no cache).

    Known: torchtune's ``SFTDataset`` and ``TextCompletionDataset`` over a
    ``datasets.Dataset``, with torchtune's own message transform and
    tokenizer classes. The table's content is keyed separately (by the
    cache key of the caller); this covers the classes, the transform's
    settings, the tokenizer's state and ``max_seq_len``, and torchtune's version.
    """
    import torchtune


    try:
        sft, text = _sft_parts(ds), _text_parts(ds)
    except ImportError:  # pragma: no cover
        return None
    if sft is not None:
        mt, tok, _ = sft
        parts = [_settings(mt)]
        if not type(mt).__module__.startswith("torchtune."):
            return None
    elif text is not None:
        tok, _ = text
        parts = [pickle.dumps((ds._column, ds.add_eos))]
    else:
        return None
    if not type(tok).__module__.startswith("torchtune."):
        return None
    h = hashlib.sha256()
    h.update(f"{_FINGERPRINT_VERSION}\0{torchtune.__version__}\0{type(ds).__qualname__}\0".encode())
    for p in parts:
        h.update(p)
    template = getattr(tok, "prompt_template", None)
    h.update(pickle.dumps((getattr(tok, "max_seq_len", None), type(template).__qualname__,
                           repr(getattr(template, "template", None)))))
    h.update(_content_digest(tok, "torchtune"))
    return h.hexdigest()
