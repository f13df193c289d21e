"""One call from chat files to packed sequences, cached: build, save, load.

:func:`build` runs the two expensive steps through the content-addressed
cache (:mod:`vecpack.cache`), each keyed by everything its output depends on::

    data files --content hash--+
    tokenizer files/template --+--> corpus-<key>/  tokens labels offsets row_ids .npy
    style, column, masking ----+          |   (tokenize: all cores, minutes at 4M rows)
                                          v
              max_len, strategy, --> plan-<key>/   doc_index doc_start doc_length pack_offsets .npy
              long, shuffle_seed          |   (plan: seconds)
                                          v
                                       Packed  (memory-mapped; [P, max_len] arrays filled lazily)

A second ``build`` with the same inputs tokenizes nothing and returns
byte-identical arrays in milliseconds; changing only ``max_len`` (or the
strategy) re-plans without re-tokenizing. :func:`save` writes a packed dataset
as a self-contained directory; :func:`load` opens it (or a ``plan-...`` cache
entry) memory-mapped.

>>> import vecpack, tempfile
>>> from vecpack.testing import make_sharegpt, cached_tokenizer_dir
>>> data = make_sharegpt(tempfile.mkdtemp() + "/chat.jsonl", 50)        # doctest: +SKIP
>>> packed = vecpack.build(data, cached_tokenizer_dir(), 2048)          # doctest: +SKIP
>>> packed.build_info.corpus_hit, len(packed) > 0                        # doctest: +SKIP
(False, True)
>>> out = vecpack.save(packed, tempfile.mkdtemp() + "/packed")          # doctest: +SKIP
>>> vecpack.load(out)[0]["input_ids"].shape                              # doctest: +SKIP
(2048,)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import shutil
import time
import uuid

import numpy as np

from . import cache as _cache
from ._version import __version__
from .packed import Packed, pack, warm_kernels
from .plan import LONG_POLICIES, STRATEGIES, Plan, plan

__all__ = ["BuildInfo", "build", "corpus_key_inputs", "load", "save", "tokenizer_fingerprint"]

logger = logging.getLogger("vecpack")

#: Bump when tokenization output changes for the same inputs (template
#: rendering, masking rules, encoders): every cached corpus is then rebuilt.
CORPUS_FORMAT = 1
#: Bump when plans change for the same lengths and options.
PLAN_FORMAT = 1
#: Layout of directories written by :func:`save`.
SAVED_FORMAT = 1

_CORPUS_ARRAYS = ("tokens", "labels", "offsets", "row_ids")
_PLAN_ARRAYS = ("doc_index", "doc_start", "doc_length", "pack_offsets")

# Files of a Hugging Face tokenizer directory that can change its output.
# Model weights (often in the same directory) are deliberately not read.
_TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json", "tekken.json",
    "config.json",
})
_TOKENIZER_SUFFIXES = (".tiktoken",)


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """Where a :func:`build` result came from (``packed.build_info``).

    Attributes:
        cache_dir: the cache root, or None with ``cache=False``.
        corpus_key, plan_key: cache keys (None with ``cache=False``).
        corpus_path, plan_path: the entries' directories.
        corpus_hit, plan_hit: True when read from the cache, False when built now.
        tokenize_stats: ``Tokenized.stats`` of the run that built the corpus.
        row_ids: int64 [D], the input row of every document.
        seconds: wall time of this call.
        described: readable inputs: ``data_files`` (paths as given) and
            ``tokenizer`` (its path, or its type name).
    """

    cache_dir: pathlib.Path | None
    corpus_key: str | None
    plan_key: str | None
    corpus_path: pathlib.Path | None
    plan_path: pathlib.Path | None
    corpus_hit: bool
    plan_hit: bool
    tokenize_stats: dict
    row_ids: np.ndarray | None = dataclasses.field(default=None, repr=False)
    seconds: float = 0.0
    described: dict = dataclasses.field(default_factory=dict)


# --------------------------------------------------------------------------- fingerprints

def _hash_arrow_table(table) -> str:
    """Content hash of an in-memory Arrow table, streamed through IPC (no full copy)."""
    import pyarrow as pa

    h = hashlib.blake2b(digest_size=16)

    class _Sink:  # a write-only file that feeds the hash
        closed = False

        def write(self, b):
            h.update(b)
            return len(b)

        def flush(self):
            pass

    with pa.ipc.new_stream(pa.PythonFile(_Sink(), mode="w"), table.schema) as w:
        for batch in table.to_batches(max_chunksize=1 << 16):
            w.write_batch(batch)
    return f"arrow-blake2b_128:{h.hexdigest()}"


def _data_fingerprint(data_files, root: pathlib.Path, verify: bool) -> tuple[list, list[str]]:
    """(key part, readable names) for the inputs: content hashes, in order."""
    from .sources import resolve_sources

    sources = resolve_sources(data_files)
    files = [s.name for s in sources if s.kind != "dataset"]
    digests = iter(_cache.file_digests(files, verify=verify, root=root))
    parts, names = [], []
    for src in sources:
        digest = _hash_arrow_table(src.table) if src.kind == "dataset" else next(digests)
        parts.append({"kind": src.kind, "content": digest})
        names.append(src.name)
    return parts, names


def _is_tokenizer_file(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return (name in _TOKENIZER_FILES or name.endswith(_TOKENIZER_SUFFIXES)
            or (rel.startswith("additional_chat_templates/") and name.endswith(".jinja")))


def tokenizer_fingerprint(tokenizer, *, root: str | os.PathLike | None = None,
                          verify: bool = False) -> str:
    """A stable content hash of a tokenizer, its chat template included.

    Args:
        tokenizer: a local Hugging Face tokenizer directory (its tokenizer
            files are hashed by content: ``tokenizer.json``,
            ``tokenizer_config.json``, vocab/merges, ``*.tiktoken``, chat
            template files...; weights are not read), a ``transformers``
            tokenizer object (its serialized backend, chat template and
            options), or any object with a ``fingerprint`` string (a vecpack
            encoder).
        root: where the file-hash memo lives (default: the default cache).
        verify: re-read files instead of trusting the memo.

    >>> from vecpack.testing import cached_tokenizer_dir
    >>> fp = tokenizer_fingerprint(cached_tokenizer_dir("qwen2.5"))     # doctest: +SKIP
    """
    fp = getattr(tokenizer, "fingerprint", None)
    if isinstance(fp, str) and fp:
        return f"encoder:{type(tokenizer).__qualname__}:{fp}"
    if isinstance(tokenizer, (str, os.PathLike)):
        d = pathlib.Path(tokenizer)
        if d.is_file():  # e.g. a tokenizer.json or tiktoken file on its own
            return "file:" + _cache.hash_files(d, names=True, verify=verify, root=root)
        if not d.is_dir():
            raise FileNotFoundError(f"tokenizer: no such directory: {str(tokenizer)!r}")
        files = sorted(str(p.relative_to(d)).replace(os.sep, "/")
                       for p in d.rglob("*") if p.is_file())
        files = [f for f in files if _is_tokenizer_file(f)]
        if not files:
            raise FileNotFoundError(f"tokenizer: {str(d)!r} holds no tokenizer files "
                                    f"(expected tokenizer.json, tokenizer_config.json, ...)")
        h = hashlib.blake2b(digest_size=16)
        digests = _cache.file_digests([d / rel for rel in files], verify=verify, root=root)
        for rel, digest in zip(files, digests):  # the name and the content of every file
            h.update(f"{rel}\0{digest}\n".encode())
        return f"dir:{h.hexdigest()}"
    return "object:" + _object_fingerprint(tokenizer)


def _object_fingerprint(tok) -> str:
    """A transformers tokenizer object: backend, template, special tokens, options."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{type(tok).__module__}.{type(tok).__qualname__}\n".encode())
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode())
    elif hasattr(tok, "save_pretrained"):  # slow tokenizers: hash what they save
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            tok.save_pretrained(tmp)
            for p in sorted(pathlib.Path(tmp).rglob("*")):
                if p.is_file():
                    h.update(p.name.encode() + b"\0" + p.read_bytes())
    else:
        raise TypeError(f"tokenizer must be a tokenizer directory, a transformers tokenizer or an "
                        f"encoder with a 'fingerprint'; got {type(tok).__name__}")
    template = getattr(tok, "chat_template", None)
    h.update(b"\0template\0" + json.dumps(template, sort_keys=True, default=str).encode())
    skip = {"name_or_path", "_commit_hash", "tokenizer_file", "vocab_file", "merges_file",
            "special_tokens_map_file", "chat_template", "added_tokens_decoder"}
    kwargs = {k: v for k, v in (getattr(tok, "init_kwargs", None) or {}).items() if k not in skip}
    h.update(json.dumps(kwargs, sort_keys=True, default=str).encode())
    h.update(json.dumps(getattr(tok, "special_tokens_map", {}), sort_keys=True, default=str).encode())
    return h.hexdigest()


def corpus_key_inputs(data_files, tokenizer, *, style="sharegpt", column=None, masking="assistant",
                      on_error="raise", encoder=None, root=None, verify=False) -> tuple[dict, dict]:
    """(key inputs, readable description) of a tokenized corpus.

    The key inputs hold content hashes only (no paths), so moving the data
    or the tokenizer keeps the key.
    """
    root = pathlib.Path(root) if root is not None else _cache.default_root()
    data, names = _data_fingerprint(data_files, root, verify)
    tok = tokenizer_fingerprint(encoder if encoder is not None else tokenizer, root=root, verify=verify)
    inputs = {"format": CORPUS_FORMAT, "data": data, "tokenizer": tok, "style": style,
              "column": column, "masking": masking, "on_error": on_error}
    return inputs, _describe(names, tokenizer, encoder)


def _describe(data_files, tokenizer, encoder) -> dict:
    if isinstance(data_files, (str, os.PathLike)):
        names = [os.fspath(data_files)]
    elif isinstance(data_files, (list, tuple)):
        names = [os.fspath(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__ for f in data_files]
    else:
        names = [type(data_files).__name__]
    if isinstance(tokenizer, (str, os.PathLike)):
        tok = os.path.abspath(os.fspath(tokenizer))
    else:
        tok = type(encoder if encoder is not None else tokenizer).__name__
    return {"data_files": [os.path.abspath(n) if os.path.exists(n) else n for n in names], "tokenizer": tok}


# --------------------------------------------------------------------------- pad id

def _pad_id(tokenizer, encoder) -> int:
    """The tokenizer's pad token id, else its eos id (as ChatEncoder does), else 0.

    The value only fills ``input_ids`` of padding, whose labels are
    ``ignore_index`` and whose document id is -1.
    """
    for attrs in (("pad_id", "pad_token_id"), ("eos_id", "eos_token_id")):
        for obj in (encoder, tokenizer):
            if obj is None or isinstance(obj, (str, os.PathLike)):
                continue
            for attr in attrs:
                v = getattr(obj, attr, None)
                if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0:
                    return int(v)
    if isinstance(tokenizer, (str, os.PathLike)) and pathlib.Path(tokenizer).is_dir():
        v = _special_id_from_dir(pathlib.Path(tokenizer), ("pad_token", "eos_token"))
        if v is not None:
            return v
    return 0


def _special_id_from_dir(d: pathlib.Path, names: tuple[str, ...]) -> int | None:
    """Id of the first of ``names`` (``"pad_token"``, ...) set in tokenizer_config.json."""
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    tj = None
    for name in names:
        tok = cfg.get(name)
        if isinstance(tok, dict):
            tok = tok.get("content")
        if not isinstance(tok, str):
            continue
        for idx, info in (cfg.get("added_tokens_decoder") or {}).items():
            if isinstance(info, dict) and info.get("content") == tok:
                return int(idx)
        if tj is None:
            try:
                tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                tj = {}
        for info in tj.get("added_tokens") or []:
            if info.get("content") == tok:
                return int(info["id"])
        vocab = (tj.get("model") or {}).get("vocab")
        if isinstance(vocab, dict) and tok in vocab:
            return int(vocab[tok])
    return None


# --------------------------------------------------------------------------- build

def _check_options(max_len, strategy, long, shuffle_seed, on_error):
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)):
        raise TypeError(f"max_len must be an int, got {type(max_len).__name__}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {sorted(STRATEGIES)}")
    if long not in LONG_POLICIES:
        raise ValueError(f"unknown long policy {long!r}; expected one of {sorted(LONG_POLICIES)}")
    if shuffle_seed is not None and (isinstance(shuffle_seed, bool)
                                     or not isinstance(shuffle_seed, (int, np.integer))):
        raise TypeError(f"shuffle_seed must be an int or None, got {type(shuffle_seed).__name__}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")


def _jsonable(obj):
    """stats dicts -> plain JSON types (numpy scalars, arrays, paths)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def build(data_files, tokenizer=None, max_len: int | None = None, *, style: str = "sharegpt",
          column: str | None = None, masking: str = "assistant", strategy: str = "bfd",
          long: str = "truncate", shuffle_seed: int | None = 0, pad_id: int | None = None,
          ignore_index: int = -100, n_jobs: int = -1, on_error: str = "raise", progress: bool = True,
          cache: bool = True, cache_dir: str | os.PathLike | None = None, backend: str = "loky",
          encoder=None, verify: bool = False) -> Packed:
    """Tokenize chat data and pack it, through the cache.

    Args:
        data_files: JSONL/JSON/Parquet path(s) or glob(s), or a
            ``datasets.Dataset`` (see :func:`vecpack.tokenize`).
        tokenizer: a local Hugging Face tokenizer directory or a
            ``transformers`` tokenizer (may be None when ``encoder`` is given).
        max_len: tokens per pack.
        style, column, masking, n_jobs, on_error, progress, backend: as
            :func:`vecpack.tokenize` (``n_jobs``, ``progress`` and
            ``backend`` do not change the output, so they are not in the key).
        strategy, long, shuffle_seed: as :func:`vecpack.plan`.
        pad_id: padding id; default the tokenizer's pad token, else 0.
        ignore_index: label of padding and of every entry's first token.
        cache: False tokenizes and packs in memory, touching no cache.
        cache_dir: cache root (default ``$VECPACK_CACHE``, else
            ``~/.cache/vecpack``); ``$VECPACK_CACHE_MAX_GB`` caps its size.
        encoder: any object with ``encode_row(row) -> (tokens, labels)``,
            ``backend`` and a stable ``fingerprint`` string (e.g.
            :class:`vecpack.tt_encoder.TorchtuneEncoder`); used instead of
            ``tokenizer``, and its fingerprint keys the cache.
        verify: re-hash the inputs ignoring the stat memo, and compare the
            cached arrays' checksums before trusting them.

    Returns:
        A :class:`~vecpack.Packed` over memory-mapped arrays, with
        ``packed.build_info`` (a :class:`BuildInfo`: keys, paths, hits).

    A cache hit logs one INFO line on the ``"vecpack"`` logger saying where
    the data came from.
    """
    t0 = time.perf_counter()
    if max_len is None:
        raise TypeError("build() needs max_len")
    _check_options(max_len, strategy, long, shuffle_seed, on_error)
    max_len = int(max_len)
    if tokenizer is None and encoder is None:
        raise TypeError("build() needs a tokenizer (a directory or a transformers tokenizer) or encoder=")
    from .tokenize import tokenize

    tok_kwargs = dict(style=style, column=column, masking=masking, n_jobs=n_jobs, on_error=on_error,
                      progress=progress, backend=backend)
    if encoder is not None:
        tok_kwargs["encoder"] = encoder

    if not cache:
        warm_kernels(strategy, long)  # loads while the tokenizer loads
        t = tokenize(data_files, tokenizer, **tok_kwargs)
        packed = pack(t.tokens, t.offsets, max_len, labels=t.labels, strategy=strategy,
                      pad_id=_pad_id(tokenizer, t.encoder or encoder) if pad_id is None else pad_id,
                      ignore_index=ignore_index, long=long, shuffle_seed=shuffle_seed)
        packed.build_info = BuildInfo(None, None, None, None, None, False, False, dict(t.stats),
                                      np.asarray(t.row_ids), time.perf_counter() - t0,
                                      _describe(data_files, tokenizer, encoder))
        return packed

    store = _cache.Cache(cache_dir)
    inputs, described = corpus_key_inputs(data_files, tokenizer, style=style, column=column,
                                          masking=masking, on_error=on_error, encoder=encoder,
                                          root=store.root, verify=verify)
    ckey = _cache.make_key("corpus", inputs)

    def build_corpus(tmp: pathlib.Path) -> dict:
        warm_kernels(strategy, long)  # loads while the tokenizer loads
        t = tokenize(data_files, tokenizer, out_dir=tmp, **tok_kwargs)
        missing = [n for n in _CORPUS_ARRAYS if not (tmp / f"{n}.npy").exists()]
        if missing:
            raise RuntimeError(f"vecpack.tokenize(out_dir=...) did not write {missing}")
        return {"stats": _jsonable(dict(t.stats)), "pad_id": _pad_id(tokenizer, t.encoder or encoder)}

    corpus = store.get_or_build(ckey, build_corpus, kind="corpus", verify=verify,
                                meta={"inputs": inputs, "described": described})
    offsets = corpus.arrays["offsets"]

    pinputs = {"format": PLAN_FORMAT, "corpus": ckey, "max_len": max_len, "strategy": strategy,
               "long": long, "shuffle_seed": None if shuffle_seed is None else int(shuffle_seed)}
    pkey = _cache.make_key("plan", pinputs)

    def build_plan(tmp: pathlib.Path) -> dict:
        p = plan(np.diff(offsets), max_len, strategy=strategy, long=long, shuffle_seed=shuffle_seed)
        for n in _PLAN_ARRAYS:
            np.save(tmp / f"{n}.npy", np.ascontiguousarray(getattr(p, n), dtype=np.int64))
        return {"stats": _jsonable(dict(p.stats))}

    pentry = store.get_or_build(pkey, build_plan, kind="plan", verify=verify, keep=(ckey,),
                                meta={"inputs": pinputs, "corpus": ckey})
    packed = _packed_from_entries(corpus, pentry, pad_id=pad_id, ignore_index=ignore_index)
    seconds = time.perf_counter() - t0
    packed.build_info = BuildInfo(store.root, ckey, pkey, corpus.path, pentry.path, not corpus.built,
                                  not pentry.built, dict(corpus.meta.get("stats", {})),
                                  corpus.arrays.get("row_ids"), seconds,
                                  described)
    _log_build(packed, corpus, pentry, store, seconds)
    return packed


def _packed_from_entries(corpus, pentry, *, pad_id=None, ignore_index=-100) -> Packed:
    a = pentry.arrays
    p = Plan(doc_index=a["doc_index"], doc_start=a["doc_start"], doc_length=a["doc_length"],
             pack_offsets=a["pack_offsets"], max_len=int(pentry.meta["inputs"]["max_len"]),
             stats=dict(pentry.meta.get("stats", {})))
    if pad_id is None:
        pad_id = int(corpus.meta.get("pad_id", 0))
    # The entries' sizes and headers were checked on open and the plan was checked against
    # this corpus when it was built: skip the O(documents) re-check so a reopen stays lazy.
    return Packed(corpus.arrays["tokens"], corpus.arrays["offsets"], p, labels=corpus.arrays["labels"],
                  pad_id=pad_id, ignore_index=ignore_index, validate=False)


def _log_build(packed, corpus, pentry, store, seconds):
    stats = packed.stats
    what = (f"{stats.get('num_documents', '?'):,} documents in {len(packed):,} packs of "
            f"{packed.max_len} (fill {stats.get('fill', float('nan')):.3f})")
    tstats = corpus.meta.get("stats") or {}
    if not corpus.built and tstats.get("rejected"):  # never let skipped rows go unreported
        examples = "; ".join(str(e) for e in (tstats.get("rejected_examples") or [])[:3])
        logger.warning("vecpack: %s of %s input rows were rejected when this corpus was built "
                       "(on_error='skip')%s", f"{tstats['rejected']:,}", f"{tstats.get('rows', '?'):,}",
                       f"; first: {examples}" if examples else "")
    if not corpus.built and not pentry.built:
        logger.info("vecpack: cache hit: %s loaded from %s (%s, built %s) in %.3f s", what,
                    pentry.path.parent, corpus.key, corpus.manifest.get("created"), seconds)
    elif not corpus.built:
        logger.info("vecpack: tokenized corpus from cache %s; re-packed into %s, stored as %s, in %.2f s",
                    corpus.path, what, pentry.path, seconds)
    else:
        logger.info("vecpack: built %s in %.2f s; cached in %s (%s, %s)", what, seconds,
                    store.root, corpus.key, pentry.key)


# --------------------------------------------------------------------------- save / load

def save(packed: Packed, out_dir: str | os.PathLike, *, overwrite: bool = True) -> pathlib.Path:
    """Write a packed dataset as a self-contained directory.

    The directory holds the corpus (``tokens``, ``labels``, ``offsets``, and
    ``row_ids`` when known) and the plan (``doc_index``, ``doc_start``,
    ``doc_length``, ``pack_offsets``) as ``.npy`` files, plus a
    ``manifest.json`` (max_len, pad_id, ignore_index, stats, checksums,
    provenance). It is written next to ``out_dir`` and renamed into place,
    so a reader never sees a partial dataset. :func:`load` opens it.

    Args:
        packed: a :class:`~vecpack.Packed` (from :func:`build`, :func:`load`
            or :func:`vecpack.pack`).
        out_dir: the directory to create.
        overwrite: replace an existing dataset written by ``save``
            (anything else at ``out_dir`` is never replaced).

    Returns:
        ``out_dir`` as a :class:`pathlib.Path`.
    """
    if not isinstance(packed, Packed):
        raise TypeError(f"packed must be a vecpack.Packed, got {type(packed).__name__}")
    out = pathlib.Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise FileExistsError(f"save: {str(out)!r} exists and is not a directory")
        existing = list(out.iterdir())
        if existing:
            m = out / "manifest.json"
            kind = None
            if m.is_file():
                try:
                    kind = json.loads(m.read_text()).get("kind")
                except (OSError, ValueError):
                    pass
            if kind != "packed":
                raise FileExistsError(f"save: {str(out)!r} is not empty and is not a vecpack "
                                      f"dataset; refusing to overwrite it")
            if not overwrite:
                raise FileExistsError(f"save: {str(out)!r} already holds a dataset (overwrite=False)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.incomplete-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        arrays = {"tokens": packed.tokens, "labels": packed.token_labels, "offsets": packed.offsets,
                  "doc_index": packed.plan.doc_index, "doc_start": packed.plan.doc_start,
                  "doc_length": packed.plan.doc_length, "pack_offsets": packed.plan.pack_offsets}
        info = getattr(packed, "build_info", None)
        if info is not None and info.row_ids is not None:
            arrays["row_ids"] = info.row_ids
        for name, a in arrays.items():
            with open(tmp / f"{name}.npy", "wb") as f:
                np.lib.format.write_array(f, np.asarray(a), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
        now = time.time()
        provenance = {}
        if info is not None:
            provenance = {"cache_dir": None if info.cache_dir is None else str(info.cache_dir),
                          "corpus_key": info.corpus_key, "plan_key": info.plan_key,
                          "tokenize_stats": _jsonable(info.tokenize_stats),
                          **_jsonable(info.described)}
        manifest = {
            "layout": _cache.CACHE_LAYOUT_VERSION, "format": SAVED_FORMAT, "kind": "packed",
            "key": None, "meta": {"max_len": packed.max_len, "pad_id": packed.pad_id,
                                  "ignore_index": packed.ignore_index,
                                  "stats": _jsonable(dict(packed.stats)), "provenance": provenance},
            "arrays": _cache.describe_arrays(tmp), "checksum_algorithm": _cache.checksum_algorithm(),
            "vecpack_version": __version__, "created": _cache._iso(now), "created_unix": now,
        }
        _cache.write_manifest(tmp, manifest)
        _cache._fsync_path(tmp, directory=True)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            os.rename(out, old)
        os.rename(tmp, out)
        _cache._fsync_path(out.parent, directory=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def load(path: str | os.PathLike, *, verify: bool = False, pad_id: int | None = None,
         ignore_index: int | None = None) -> Packed:
    """Open a packed dataset memory-mapped.

    Args:
        path: a directory written by :func:`save` (or ``vecpack pack -o``),
            or a ``plan-...`` cache entry (its corpus entry is found next to it).
        verify: compare checksums (file sizes and ``.npy`` headers are always
            checked).
        pad_id, ignore_index: override the stored values.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: not a vecpack dataset, or a damaged one (naming the file).
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"load: no such dataset: {str(path)!r}")
    try:
        manifest = _cache.read_manifest(path)
    except _cache._CorruptEntry as e:
        raise ValueError(f"load: {str(path)!r} is not a vecpack dataset ({e})") from None
    kind = manifest.get("kind")
    if kind == "packed":
        try:
            _cache.verify_arrays(path, manifest["arrays"], checksums=verify)
        except _cache._CorruptEntry as e:
            raise ValueError(f"load: {str(path)!r} is damaged: {e}") from None
        a = _cache.open_arrays(path, manifest["arrays"])
        meta = manifest["meta"]
        p = Plan(doc_index=a["doc_index"], doc_start=a["doc_start"], doc_length=a["doc_length"],
                 pack_offsets=a["pack_offsets"], max_len=int(meta["max_len"]), stats=dict(meta["stats"]))
        packed = Packed(a["tokens"], a["offsets"], p, labels=a["labels"],
                        pad_id=int(meta["pad_id"]) if pad_id is None else pad_id,
                        ignore_index=int(meta["ignore_index"]) if ignore_index is None else ignore_index,
                        validate=verify)
        prov = meta.get("provenance") or {}
        packed.build_info = BuildInfo(None, prov.get("corpus_key"), prov.get("plan_key"), None, None,
                                      True, True, dict(prov.get("tokenize_stats") or {}),
                                      a.get("row_ids"), 0.0,
                                      {k: prov[k] for k in ("data_files", "tokenizer") if k in prov})
        return packed
    if kind == "plan":
        store = _cache.Cache(path.parent)
        pentry = store.open(path.name, verify=verify)
        corpus_key = manifest.get("meta", {}).get("corpus")
        corpus = store.open(corpus_key, verify=verify) if pentry is not None and corpus_key else None
        if pentry is None or corpus is None:
            raise ValueError(f"load: cache entry {str(path)!r} is damaged or its corpus entry "
                             f"{corpus_key!r} is gone; run vecpack.build again")
        packed = _packed_from_entries(corpus, pentry, pad_id=pad_id,
                                      ignore_index=-100 if ignore_index is None else ignore_index)
        packed.build_info = BuildInfo(store.root, corpus.key, pentry.key, corpus.path, pentry.path,
                                      True, True, dict(corpus.meta.get("stats", {})),
                                      corpus.arrays.get("row_ids"), 0.0,
                                      dict(corpus.meta.get("described") or {}))
        return packed
    if kind == "corpus":
        raise ValueError(f"load: {str(path)!r} is a tokenized corpus without a packing; open a "
                         f"plan-... entry, or call vecpack.build(..., max_len=...)")
    raise ValueError(f"load: {str(path)!r} is not a vecpack dataset (manifest kind {kind!r})")
