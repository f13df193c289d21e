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
>>> _ = open(p, "w").write('{"text": "hi"}\\n')
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

The parts of a request, one frozen dataclass per stage, each validated once by :mod:`vecpack.options`.

Each field's role (in the cache key, output-neutral, or applied on read) is
declared here, next to the field (:mod:`vecpack.options`).

>>> PackSpec.make(4096, strategy="ffd")
PackSpec(max_len=4096, strategy='ffd', long='truncate', shuffle_seed=0, prefix_sharing=False, pad_to_multiple_of=1, \
pad_id=None, ignore_index=-100)
>>> RunSpec.make(on_error="ignore")
Traceback (most recent call last):
...
ValueError: unknown on_error 'ignore'; on_error must be one of ['raise', 'skip']
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

from vecpack._lazy import lazy_module
from vecpack.inputs.readers import sample_rows
from vecpack.inputs.sources import InputFile, resolve_sources
from vecpack.options import (
    check_mix,
    check_n_jobs,
    check_options,
    check_per_turn,
    check_per_turn_call,
    check_tokenizer_dir,
    key_fields,
    neutral,
)
from vecpack.packing.mix import as_sources, data_name, is_mixture, own_options
from vecpack.packing.plan import PackSpec
from vecpack.store import hashing
from vecpack.store.hashing import CORPUS_FORMAT, data_fingerprint, describe, tokenizer_fingerprint
from vecpack.store.objects import is_url

# the cluster's modules load on its route only: a local build never imports them (docs/architecture.md)
_cluster_units = lazy_module("vecpack.cluster.units")

__all__ = ["ChatSpec", "Input", "KINDS", "MIX_FORMAT", "MixSpec", "PAIR_PLAN_FORMAT", "PLAN_FORMAT",
           "PREPROCESSOR_CONFIG", "PackSpec", "Request", "RunSpec", "TokenizerSpec", "WHERE", "checkpoint_processor",
           "corpus_key", "make_request", "mix_key", "plan_key", "resolve_inputs", "row_has_images"]


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
            files = tuple(InputFile(url, "url", 0) for url in _cluster_units.expand_inputs(data_files))
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
        tok: the request's :class:`~vecpack.pipeline.request.TokenizerSpec`.
        run: the request's :class:`~vecpack.pipeline.request.RunSpec` (``verify``: re-hash the files).
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


@dataclasses.dataclass(frozen=True)
class ChatSpec:
    """How one input's rows become conversations and which tokens are trained.

    Attributes:
        style: the row format (``sharegpt``, ``openai``, ``alpaca``, ``text``, ``preference``).
        column: the column holding the conversation; None: the style's default.
        masking: which tokens carry the loss (``assistant``, ``last``, ``all``).
        chat_template_kwargs: template variables for every row (e.g. ``{"enable_thinking": false}``),
            as canonical JSON text; a row's own ``chat_template_kwargs`` win over them.
        train_reasoning: False keeps each assistant message's reasoning out of the loss.
        per_turn: one document per trained assistant turn, the conversation up to it rendered as its
            final turn (its reasoning kept), packed as one token trie per conversation (:mod:`vecpack.packing.turns`).
    """

    style: str = "sharegpt"
    column: str | None = None
    masking: str = "assistant"
    chat_template_kwargs: str | None = None
    train_reasoning: bool = True
    per_turn: bool = False

    @classmethod
    def make(cls, style: str = "sharegpt", column: str | None = None, masking: str = "assistant",
             chat_template_kwargs: dict | None = None, train_reasoning: bool = True,
             per_turn: bool = False) -> "ChatSpec":
        check_options(style=style, masking=masking)
        if column is not None and not isinstance(column, str):
            raise TypeError(f"column must be a string, got {type(column).__name__}")
        if not isinstance(train_reasoning, bool):
            raise TypeError(f"train_reasoning must be a bool, got {type(train_reasoning).__name__}")
        kwargs = None
        if chat_template_kwargs:
            if not isinstance(chat_template_kwargs, dict):
                raise TypeError(f"chat_template_kwargs must be a dict (template variable -> value), got "
                                f"{type(chat_template_kwargs).__name__}")
            try:
                kwargs = json.dumps(chat_template_kwargs, sort_keys=True, ensure_ascii=False)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"chat_template_kwargs must hold JSON values: {exc}") from None
        if style == "preference" and (kwargs is not None or not train_reasoning):
            raise ValueError("chat_template_kwargs= and train_reasoning= apply to chat rows; a preference pair "
                             "takes its template variables from its own 'chat_template_kwargs' column")
        if not isinstance(per_turn, bool):
            raise TypeError(f"per_turn must be a bool, got {type(per_turn).__name__}")
        if per_turn:
            check_per_turn(style, masking)
        return cls(style, column, masking, kwargs, train_reasoning, per_turn)

    def with_format(self, style: str, column: str | None, masking: str) -> "ChatSpec":
        """This spec with another row format (a mixture's source), validated; the call's template options kept."""
        return ChatSpec.make(style, column, masking, self.template_kwargs(), self.train_reasoning, self.per_turn)

    def template_kwargs(self) -> dict | None:
        """``chat_template_kwargs`` as a dict (None when not given)."""
        return None if self.chat_template_kwargs is None else json.loads(self.chat_template_kwargs)

    def encoder_options(self) -> dict:
        """The chat encoder's keywords for the template options, only those not at their default."""
        out = {}
        if self.chat_template_kwargs is not None:
            out["chat_template_kwargs"] = self.template_kwargs()
        if not self.train_reasoning:
            out["train_reasoning"] = False
        if self.per_turn:
            out["per_turn"] = True
        return out


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """What turns text (and images) into ids: a tokenizer (directory or object), a ready encoder, or a
    vision-language processor directory (:mod:`vecpack.vision`).

    Each is keyed by content (:func:`vecpack.store.hashing.tokenizer_fingerprint`, the processor's
    fingerprint), never by path or identity.
    """

    tokenizer: Any = None
    encoder: Any = None
    processor: Any = None

    @classmethod
    def make(cls, tokenizer=None, encoder=None, processor=None, *, needed: str = "build()") -> "TokenizerSpec":
        if processor is not None:
            if tokenizer is not None or encoder is not None:
                raise ValueError("pass processor= (a vision-language processor directory) or tokenizer= / encoder=, "
                                 "not both: the processor holds the tokenizer and the chat template")
            return cls(None, None, check_tokenizer_dir(processor, "processor"))
        if tokenizer is None and encoder is None:
            raise TypeError(f"{needed}: a tokenizer is required (a local Hugging Face tokenizer directory or a "
                            f"transformers tokenizer), or encoder=")
        if encoder is None:
            check_tokenizer_dir(tokenizer)
        elif not hasattr(encoder, "encode_row"):
            raise TypeError(f"encoder must have an encode_row(row) method, got {type(encoder).__name__}")
        return cls(tokenizer, encoder)

    @property
    def keyed(self):
        """What the tokenizer key hashes: the encoder when one is given, else the tokenizer."""
        return self.encoder if self.encoder is not None else self.tokenizer


#: What ``PackSpec.make``'s ``unit`` packs, in messages.
@dataclasses.dataclass(frozen=True)
class MixSpec:
    """How a mixture's weights share out the output (see ``docs/mixtures.md``)."""

    by: str = "tokens"
    total: int | None = None
    seed: int = 0
    repeat: bool = True

    @classmethod
    def make(cls, by: str = "tokens", total: int | None = None, seed: int = 0, repeat: bool = True) -> "MixSpec":
        m = check_mix(by, total, seed, repeat)
        return cls(m["mix_by"], m["mix_total"], m["mix_seed"], m["mix_repeat"])

    def as_kwargs(self) -> dict:
        """The ``mix_*`` keywords of the mixture planners."""
        return {"mix_by": self.by, "mix_total": self.total, "mix_seed": self.seed, "mix_repeat": self.repeat}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """How the work runs: none of it changes the output, except ``on_error``.

    Attributes:
        on_error: ``raise`` at the first bad row, or ``skip`` (counted) it.
        n_jobs: worker processes (-1: every core).
        progress: show progress bars and a summary.
        executor: ``loky`` (local processes) or ``ray``.
        cache: False tokenizes and packs in memory, touching no cache.
        cache_dir: the cache root (None: ``$VECPACK_CACHE``, else ``~/.cache/vecpack``).
        verify: re-hash the inputs and check the cached arrays' checksums.
        allow_useless: return packs that would train on nothing or on little of the input.
        chunk_bytes: input bytes per task (None: about 16 tasks per worker).
        pixels: documents with images: their pixels preprocessed once into the cache, or ``lazy`` at
            batch time (the same values).
        output: where the packed dataset is also saved (a directory, or an object-store URL; with
            ``executor="ray"`` the nodes write it there themselves: :mod:`vecpack.cluster`).
    """

    on_error: str = "raise"
    n_jobs: int = neutral(-1)
    progress: bool = neutral(True)
    executor: str = neutral("loky")
    cache: bool = neutral(True)
    cache_dir: str | os.PathLike | None = neutral(None)
    verify: bool = neutral(False)
    allow_useless: bool = neutral(False)
    chunk_bytes: int | None = neutral(None)
    output: str | None = neutral(None)
    pixels: str = neutral("cache")

    @classmethod
    def make(cls, *, on_error: str = "raise", executor: str = "loky", n_jobs: int | None = -1,
             **rest) -> "RunSpec":
        """Validated; ``rest``: the other fields, by name (a wrong name is a ``TypeError``)."""
        check_options(on_error=on_error, executor=executor, pixels=rest.get("pixels", "cache"))
        check_n_jobs(n_jobs)
        return cls(on_error=on_error, n_jobs=n_jobs, executor=executor, **rest)
