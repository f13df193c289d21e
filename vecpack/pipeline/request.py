"""One typed, immutable request, made once by each front door and read by every stage.

::

    front door (build, tokenize, streaming, torchtune, CLI)
        │  keywords, exactly as before
        ▼
    Request ─ inputs:    (Input, ...)   each: name, resolved files, ChatSpec, weight
            ─ tokenizer: TokenizerSpec  a tokenizer directory/object, or an encoder
            ─ pack:      PackSpec       max_len, strategy, long, seed... (None: tokenize only)
            ─ mix:       MixSpec        a mixture's (None: one input)
            ─ run:       RunSpec        on_error, n_jobs, progress, executor, cache...
            ─ kind:      what it builds: chat, pairs, turns, mixture, pair-mixture, vision
            ─ where:     where it runs: local (this machine's cores) or cluster (Ray nodes, output=)

The inputs are resolved here, once: files, globs, ``save_to_disk``
directories, datasets, compressed files and mixture entries. The kind and
the place are decided here, once (:data:`KINDS`, :data:`WHERE`): the route
(:mod:`vecpack.pipeline.route`) looks them up in its table. No stage asks
again whether something is a mixture, and none re-resolves a path.

>>> import os, tempfile
>>> from vecpack.testing import cached_tokenizer_dir
>>> d = tempfile.mkdtemp(); p = os.path.join(d, "a.jsonl")
>>> _ = open(p, "w").write('{"text": "hi"}\n')
>>> r = make_request(p, cached_tokenizer_dir(), {"max_len": 2048, "style": "text"})
>>> r.kind, r.where, [f.kind for f in r.inputs[0].files], r.pack.max_len, r.inputs[0].chat.style
('chat', 'local', ['jsonl'], 2048, 'text')

Every cache key of a build, from its request, in one place.

A key holds the request's fields whose role is ``"key"``
(:mod:`vecpack.options`), the content hashes of the data and the
tokenizer (:mod:`vecpack.store.hashing`), and a format number per kind of
entry. Paths, ``n_jobs``, ``progress`` and the executor are never in it.

::

    corpus-<key>  data content, tokenizer content, ChatSpec, RunSpec.on_error, CORPUS_FORMAT
    plan-<key>    the corpus key, PackSpec (max_len, strategy, long, shuffle_seed, prefix_sharing)
    pairs-<key>   the same, for preference pairs
    turns-<key>   the same, for per-turn tries (ChatSpec.per_turn; its corpus key differs too)
    mix-<key>     the corpus keys, the weights, PackSpec, MixSpec
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

from vecpack.cluster.units import expand_inputs
from vecpack.inputs.readers import sample_rows
from vecpack.inputs.sources import InputFile, resolve_sources
from vecpack.options import check_per_turn_call, key_fields
from vecpack.packing.mix import as_sources, data_name, is_mixture, own_options
from vecpack.pipeline.specs import ChatSpec, MixSpec, PackSpec, RunSpec, TokenizerSpec
from vecpack.store import hashing
from vecpack.store.hashing import CORPUS_FORMAT, data_fingerprint, describe, tokenizer_fingerprint
from vecpack.store.objects import is_url

__all__ = ["Input", "KINDS", "PREPROCESSOR_CONFIG", "checkpoint_processor", "row_has_images", "MIX_FORMAT",
           "PAIR_PLAN_FORMAT", "PLAN_FORMAT", "Request", "WHERE", "corpus_key", "make_request", "mix_key", "plan_key",
           "resolve_inputs"]


#: What a request builds, each a layout of :class:`~vecpack.packing.packed.Packed`.
KINDS = ("chat", "pairs", "turns", "mixture", "pair-mixture", "vision")
#: Where a request runs: this machine's cores (``n_jobs``, ``backend=``), or a Ray cluster's nodes
#: writing to object storage (``backend="ray"`` with ``output=``).
WHERE = ("local", "cluster")


@dataclasses.dataclass(frozen=True)
class Input:
    """One input of a request, resolved: its files, how its rows are read, and its share.

    Attributes:
        name: how messages name it (``"source 2 ('b.jsonl')"`` in a mixture).
        data: the input as the caller gave it (a path, glob, list, dataset...).
        files: its resolved files (:class:`~vecpack.inputs.sources.InputFile`), in order.
        chat: its row format and loss rule.
        weight: its share of a mixture (normalised; 1.0 alone).
    """

    name: str
    data: Any = dataclasses.field(repr=False)
    files: tuple[InputFile, ...] = dataclasses.field(repr=False)
    chat: ChatSpec
    weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class Request:
    """Everything a call asked for, validated and resolved (see the module's docstring)."""

    inputs: tuple[Input, ...]
    tokenizer: TokenizerSpec
    pack: PackSpec | None
    run: RunSpec
    mix: MixSpec | None = None
    kind: str = "chat"
    where: str = "local"

    @property
    def mixture(self) -> bool:
        """Whether the inputs are a weighted mixture (each input its own corpus)."""
        return self.kind in ("mixture", "pair-mixture")

    @property
    def pairs(self) -> bool:
        """Whether the rows are preference pairs (``style="preference"``)."""
        return self.kind in ("pairs", "pair-mixture")


def request_kind(*, pairs: bool, mixture: bool, per_turn: bool, images: bool) -> str:
    """The one place a request's kind (:data:`KINDS`) is decided."""
    if images:
        if mixture:
            raise ValueError("documents with images are not mixed yet: build each source with processor= on its "
                             "own")
        return "vision"
    if mixture:
        return "pair-mixture" if pairs else "mixture"
    if pairs:
        return "pairs"
    return "turns" if per_turn else "chat"


def resolve_inputs(data_files, weights, chat: ChatSpec, *, encoder=None, streaming: bool = False,
                   cluster: bool = False) -> tuple[tuple[Input, ...], bool]:
    """``data_files`` (with ``weights``) -> (the resolved inputs, whether they are a mixture).

    A plain path, glob, list of paths or dataset is one input; a list holding
    :class:`vecpack.Source` entries, or any ``weights``, is a mixture of one
    input per entry (see :mod:`vecpack.packing.mix`). ``streaming``: a
    ``datasets.IterableDataset`` is one input too (one file of kind ``"iterable"``); ``cluster``: the
    call runs on a Ray cluster (``backend="ray"``, ``output=``), so object-store URLs are listed here
    (files of kind ``"url"``); elsewhere a URL is an :class:`~vecpack.errors.InputError` saying so.
    """
    if not is_mixture(data_files, weights):
        if streaming and _is_iterable(data_files):
            files = (InputFile("<IterableDataset>", "iterable", 0),)
        elif cluster and _urls(data_files):  # an object store: listed here, read by the cluster's nodes
            files = tuple(InputFile(url, "url", 0) for url in expand_inputs(data_files))
        else:
            files = tuple(resolve_sources(data_files))
        return (Input(data_name(data_files), data_files, files, chat),), False
    if encoder is not None:
        own_options(data_files, "encoder=")
    sources = as_sources(data_files, weights, style=chat.style, column=chat.column, masking=chat.masking)
    for s in sources:
        if _urls(s.data):
            raise ValueError(f"{s.name}: a mixture of object-store inputs is not built on a cluster yet; build "
                             f"each source with backend='ray' and output=, or copy the files locally")
        if _is_iterable(s.data):
            raise TypeError(f"{s.name} is a datasets.IterableDataset, which cannot be mixed (its rows "
                            f"cannot be re-read for a resume); pass its files or a datasets.Dataset")
    return tuple(Input(s.name, s.data, tuple(resolve_sources(s.data)), chat.with_format(s.style, s.column, s.masking),
                       s.weight) for s in sources), True


def _urls(data) -> bool:
    """Whether ``data`` names object-store URLs (``s3://``...)."""
    items = data if isinstance(data, (list, tuple)) else [data]
    return any(is_url(x) for x in items)


def _is_iterable(obj) -> bool:
    return type(obj).__name__ == "IterableDataset" and (type(obj).__module__ or "").startswith("datasets")


#: make_request's option names -> (the spec they belong to, the spec's field).
_OPTIONS = {
    "style": "chat", "column": "chat", "masking": "chat", "chat_template_kwargs": "chat", "train_reasoning": "chat",
    "per_turn": "chat",
    "max_len": "pack", "strategy": "pack", "long": "pack", "shuffle_seed": "pack", "prefix_sharing": "pack",
    "pad_id": "pack", "ignore_index": "pack", "pad_to_multiple_of": "pack",
    "mix_by": "mix", "mix_total": "mix", "mix_seed": "mix", "mix_repeat": "mix",
    "on_error": "run", "n_jobs": "run", "progress": "run", "backend": "run", "cache": "run", "cache_dir": "run",
    "verify": "run", "allow_useless": "run", "chunk_bytes": "run", "output": "run", "pixels": "run",
    "weights": "inputs", "encoder": "tokenizer", "processor": "tokenizer",
}


def make_request(data_files, tokenizer, options: dict, *, door: str = "build()", streaming: bool = False) -> Request:
    """The request of a front door's call: ``options`` are its keywords (``max_len``: None for a
    call that only tokenizes), validated here once (by :mod:`vecpack.options`); ``streaming``: the
    inputs may be a ``datasets.IterableDataset``.

    Raises:
        TypeError: an unknown option, or no tokenizer and no encoder.
        ValueError: a bad option value, naming it and the choices.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"{door} got unknown options {unknown}")
    by = {"chat": {}, "pack": {}, "mix": {}, "run": {}}
    for name, value in options.items():
        if _OPTIONS[name] in by:
            by[_OPTIONS[name]][name] = value
    chat = ChatSpec.make(**by["chat"])
    run = by["run"]
    if "backend" in run:
        run["executor"] = run.pop("backend")
    run = RunSpec.make(**run)
    if run.output is not None and run.executor != "ray":
        raise ValueError("output= is where a Ray cluster's nodes write the packs: pass backend='ray' too (and "
                         "the inputs as URLs or paths every node shares); on one machine, vecpack.save(packed, "
                         "output) writes a built dataset there")
    where = "cluster" if run.output is not None else "local"
    tok = TokenizerSpec.make(tokenizer, options.get("encoder"), options.get("processor"), needed=door)
    inputs, mixture = resolve_inputs(data_files, options.get("weights"), chat, encoder=tok.encoder,
                                     streaming=streaming, cluster=where == "cluster")
    pack = None
    pairs = inputs[0].chat.style == "preference"
    if chat.per_turn:
        check_per_turn_call(door=door, streaming=streaming, mixture=mixture, images=tok.processor is not None,
                            cluster=where == "cluster", packs="max_len" in options,
                            encoder=tok.encoder is not None and not getattr(tok.encoder, "per_turn", False))
    if "max_len" in options:  # (a call that packs; tokenize() has no max_len)
        kw = dict(by["pack"])
        unit = ("pair" if pairs else "images" if tok.processor is not None else "turns" if chat.per_turn
                else "document")
        multiple = kw.pop("pad_to_multiple_of", 1)
        pack = PackSpec.make(kw.pop("max_len", None), unit=unit, **kw).padded(multiple, unit)
        if pack.pad_to_multiple_of > 1 and (mixture or where == "cluster"):
            raise ValueError(f"{door}: pad_to_multiple_of={pack.pad_to_multiple_of} is not supported for "
                             f"{'a mixture' if mixture else 'a Ray cluster build (output=)'} yet; build one input "
                             f"with vecpack.build(path, tokenizer, max_len, pad_to_multiple_of=...)")
    mix = None
    if mixture:
        mix = MixSpec.make(*(by["mix"].get(k, d) for k, d in
                             (("mix_by", "tokens"), ("mix_total", None), ("mix_seed", 0), ("mix_repeat", True))))
    kind = request_kind(pairs=pairs, mixture=mixture, per_turn=chat.per_turn, images=tok.processor is not None)
    return Request(inputs, tok, pack, run, mix, kind, where)


#: Bump when plans change for the same lengths and options (2: the key names every PackSpec key field).
PLAN_FORMAT = 2
#: Bump when pair plans change for the same lengths and options.
PAIR_PLAN_FORMAT = 1
#: Bump when mixed plans change for the same corpora and options (2: as PLAN_FORMAT).
MIX_FORMAT = 2


def corpus_key(inp, tok, run, *, root=None, on_read=None) -> tuple[dict, dict]:
    """(key inputs, readable description) of one input's tokenized corpus.

    Args:
        inp: a resolved :class:`~vecpack.pipeline.request.Input`.
        tok: the request's :class:`~vecpack.pipeline.specs.TokenizerSpec`.
        run: the request's :class:`~vecpack.pipeline.specs.RunSpec` (``verify``: re-hash the files).
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


# --------------------------------------------------------------------------- a checkpoint as tokenizer=
# ``vecpack.build("vl.jsonl", "Qwen2-VL-dir/", 4096)`` is what a newcomer tries first. The directory holds the
# tokenizer and, in ``preprocessor_config.json``, the image processor; rows whose messages carry image parts (or an
# ``images`` column) need the processor, which :func:`checkpoint_processor` then names, so the build takes the
# vision route as with ``processor=``. A text-only dataset keeps the text route.

#: The file that makes a directory a vision-language processor directory (transformers' name).
PREPROCESSOR_CONFIG = "preprocessor_config.json"
_SAMPLE = 64  # the rows read from the inputs' start to tell whether they hold images


def row_has_images(row, column: str | None = None) -> bool:
    """Whether a chat row carries images: a non-empty ``images`` column, or a message content part
    of type ``"image"`` (or an untyped part with an ``"image"`` key), as :mod:`vecpack.vision.encode`
    reads them.

    >>> row_has_images({"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"}]}]})
    True
    >>> row_has_images({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    False
    >>> row_has_images({"messages": [], "images": ["a.png"]}), row_has_images({"images": []})
    (True, False)
    """
    if not isinstance(row, dict):
        return False
    if row.get("images"):
        return True
    names = [column] if column else ["messages", "conversations"]
    conv = next((row[n] for n in names if n in row), None)
    if not isinstance(conv, list):
        return False
    for m in conv:
        content = m.get("content", m.get("value")) if isinstance(m, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and (part.get("type") == "image"
                                               or (part.get("type") is None and "image" in part)):
                    return True
    return False


def checkpoint_processor(tokenizer, data_files, column: str | None = None) -> str | None:
    """The directory to use as ``processor=`` for a ``tokenizer=`` that is a checkpoint directory
    holding :data:`PREPROCESSOR_CONFIG`, when the first rows of ``data_files`` carry images
    (:func:`row_has_images`); else None (the text route, whose error then names ``processor=``).

    Only local paths are looked at; inputs that cannot be read here are left to the text route,
    which reports them as it always has.
    """
    if not isinstance(tokenizer, (str, os.PathLike)):
        return None
    path = pathlib.Path(tokenizer)
    if not (path / PREPROCESSOR_CONFIG).is_file():
        return None
    try:
        rows = sample_rows(resolve_sources(data_files), _SAMPLE)
    except Exception:  # noqa: BLE001 - missing or foreign inputs: the text route says what is wrong
        return None
    return os.fspath(tokenizer) if any(row_has_images(r, column) for r in rows) else None
