"""What vecpack reads from a tokenizer directory, memoised on disk: template, special tokens, BPE tables.

* :func:`read_dir`: the chat template and the special-token variables.
* :func:`materialize`: a transformers tokenizer object written as a small
  content-addressed directory, so workers rebuild it from a path.
* :func:`tiktoken_spec`: ``(pattern, ranks, added tokens, nfc)`` for a
  byte-level BPE ``tokenizer.json`` that tiktoken reproduces, or
  :class:`Unsupported` saying why not.
* :func:`tiktoken_facts`: the same without the ranks (bytes per token id
  instead), and :func:`latin_table`: the ranks that Latin-script texts can
  use (:mod:`vecpack.tokenizing.latin`). A process that encodes with
  fastokens, or with tiktoken on Latin-script texts, does not read all the ranks.
* :func:`hf_byte_table`: bytes per token id, for the HF-tokenizers backend's labels.

Parsing a 7 MB ``tokenizer.json`` takes most of a second, so results are
pickled under ``$VECPACK_CACHE`` keyed by the files' path, size and mtime.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import numpy as np

from vecpack._state import memo
from vecpack.inputs.base import _orjson_loads
from vecpack.options import cache_root
from vecpack.tokenizing.latin import latin_ranks

__all__ = ["SPEC_VERSION", "Unsupported", "byte_lengths", "bytes_to_unicode", "hf_byte_table",
           "default_pad_id", "file_id", "latin_table", "materialize", "read_dir", "stat_key", "tiktoken_facts",
           "tiktoken_file", "tiktoken_spec", "tokenizer_dir", "MISSING", "derived", "read_memo", "write_memo"]

#: Bump when what is derived from the same files changes (on-disk memos are then ignored).
#: 2: an assistant header that goes on past the generation prompt is trained (chat.spans._header).
SPEC_VERSION = "vecpack-chat-encoder-2"
_SPECIAL_ATTRS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies are written in), in GPT-2's
    order: the printable bytes first, then the others (the order of such a vocabulary's first 256 ids)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in keep}
    for extra, b in enumerate(b for b in range(256) if b not in out):
        out[b] = chr(256 + extra)
    return out



def _token_text(value):
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_dir(path: pathlib.Path) -> tuple[str | None, dict]:
    """``(chat_template, special token variables)`` of a tokenizer directory."""
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.exists() else {}
    template = cfg.get("chat_template")
    jinja_file = path / "chat_template.jinja"
    if jinja_file.exists():
        template = jinja_file.read_text(encoding="utf-8")
    if isinstance(template, list):  # named templates: transformers uses "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    variables = {k: _token_text(cfg.get(k)) for k in _SPECIAL_ATTRS}
    return template, {k: v for k, v in variables.items() if v is not None}


def materialize(tokenizer) -> pathlib.Path:
    """Write a transformers tokenizer object as a small content-addressed directory.

    Workers then rebuild it from the path instead of receiving megabytes of
    pickled vocabulary with every task.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"tokenizer must be a local Hugging Face tokenizer directory or a fast transformers "
                        f"tokenizer (with .backend_tokenizer), got {type(tokenizer).__name__}")
    tk_json = backend.to_str()
    variables = {k: v for k, v in dict(getattr(tokenizer, "special_tokens_map", {}) or {}).items()
                 if k in _SPECIAL_ATTRS and isinstance(v, str)}
    cfg = {"chat_template": getattr(tokenizer, "chat_template", None), **variables}
    cfg_text = json.dumps(cfg, ensure_ascii=False, sort_keys=True)
    digest = hashlib.sha256(tk_json.encode("utf-8") + b"\0" + cfg_text.encode("utf-8")).hexdigest()[:24]
    out = cache_root() / "tokenizers" / digest
    if (out / "tokenizer.json").exists():
        return out
    tmp = out.parent / f".{digest}.{os.getpid()}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tokenizer_config.json").write_text(cfg_text, encoding="utf-8")
    (tmp / "tokenizer.json").write_text(tk_json, encoding="utf-8")
    try:
        os.rename(tmp, out)
    except OSError:  # another process wrote it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


class Unsupported(Exception):
    """The tokenizer is outside what the tiktoken backend reproduces."""


def byte_level(spec: dict) -> tuple[dict[bytes, int], bool, list[dict]]:
    """``(vocabulary as bytes, nfc, pre-tokenizer steps)`` of a byte-level BPE tokenizer.json.

    Every token of such a tokenizer stands for fixed bytes, and the tokens of
    a text spell its bytes (NFC-normalized when ``nfc``).

    Raises:
        Unsupported: saying which feature breaks that.
    """
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise Unsupported(f"model is {model.get('type')}, not BPE")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise Unsupported(f"BPE option {key}={model[key]!r}")
    if model.get("byte_fallback"):
        raise Unsupported("byte_fallback BPE (SentencePiece style)")
    norm = spec.get("normalizer")
    if norm and norm.get("type") == "Sequence" and len(norm.get("normalizers", ())) == 1:
        norm = norm["normalizers"][0]
    if norm and norm.get("type") != "NFC":
        raise Unsupported(f"normalizer {norm.get('type')}")
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        raise Unsupported("pre-tokenizer is not a byte-level regex split")
    b2u = bytes_to_unicode()
    table = {ord(c): chr(b) for b, c in b2u.items()}
    added = {t["content"] for t in spec.get("added_tokens", ())}
    ranks = {}
    for text, idx in model.get("vocab", {}).items():
        if text in added:
            continue
        raw = text.translate(table)
        try:
            ranks[raw.encode("latin-1")] = idx
        except UnicodeEncodeError:
            raise Unsupported(f"vocabulary entry {text!r} is not byte-level") from None
    return ranks, bool(norm), steps


def tiktoken_parts(spec: dict) -> tuple[str, dict[bytes, int], bool]:
    """``(pattern, mergeable ranks, nfc)`` for tiktoken, from a parsed tokenizer.json.

    Raises:
        Unsupported: saying which feature tiktoken cannot reproduce.
    """
    ranks, nfc, steps = byte_level(spec)
    if len(steps) == 1 and steps[0].get("use_regex", True):
        pattern = _GPT2_PATTERN
    elif (len(steps) == 2 and steps[0].get("type") == "Split" and not steps[1].get("use_regex", True)
          and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert")
          and "Regex" in (steps[0].get("pattern") or {})):
        pattern = steps[0]["pattern"]["Regex"]
    else:
        raise Unsupported("pre-tokenizer is not a byte-level regex split")
    if any(bytes([b]) not in ranks for b in range(256)):
        raise Unsupported("the vocabulary lacks some single bytes")
    vocab = spec["model"]["vocab"]
    last = -1
    for merge in spec["model"].get("merges", ()):
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        rank = vocab.get(a + b)
        if rank is None or rank < last:
            raise Unsupported(f"merges do not follow vocabulary ranks (at {a!r} + {b!r})")
        last = rank
    return pattern, ranks, nfc


def byte_lengths(ranks: dict[bytes, int], added: dict[str, int]) -> np.ndarray:
    """int64 [vocab]: how many bytes each token id spells (0 for unused ids)."""
    size = max([*ranks.values(), *added.values()]) + 1
    out = np.zeros(size, dtype=np.int64)
    out[np.fromiter(ranks.values(), np.int64, len(ranks))] = np.fromiter(map(len, ranks), np.int64,
                                                                          len(ranks))
    for text, idx in added.items():
        out[idx] = len(text.encode("utf-8"))
    return out


def hf_byte_table(path: pathlib.Path) -> tuple[np.ndarray, bool] | None:
    """``(bytes per token id, nfc)`` for the HF-tokenizers backend, or None.

    Given for byte-level BPE tokenizers (see :func:`byte_level`): HF
    tokenizers then only has to produce ids (``encode_batch_fast``, ~15%
    faster than ``encode``) and labels come from byte spans, as with tiktoken.
    Memoised on disk like :func:`tiktoken_spec`.
    """
    key = stat_key(path, "tokenizer.json")
    memo = cache_root() / "encoder" / f"{key}-bytes.pkl"
    hit = read_memo(memo, lambda o: o is None or (type(o) is tuple and len(o) == 2))
    if hit is not MISSING:
        return hit
    try:
        spec = (_orjson_loads or json.loads)((path / "tokenizer.json").read_bytes())
        ranks, nfc, _ = byte_level(spec)
        out = (byte_lengths(ranks, {t["content"]: t["id"] for t in spec.get("added_tokens", ())}), nfc)
    except (Unsupported, OSError, ValueError, KeyError, TypeError, AttributeError):
        out = None
    write_memo(memo, out)
    return out



def file_id(file, missing_ok: bool = True) -> tuple[str, int, int]:
    """``(real path, size, mtime_ns)``: what tells a tokenizer file from another.

    Symlinks are followed, so directories whose ``tokenizer.json`` is one file
    (a hub cache's snapshots, a model's template variants) name it alike: they
    share its runtime, its memos and the parity check's loaded tokenizer. A
    copy of the file is another file. A missing file is ``(real path, -1, -1)``,
    or, without ``missing_ok``, the ``OSError`` of its ``stat``.
    """
    real = os.path.realpath(file)
    try:
        st = os.stat(real)
    except OSError:
        if not missing_ok:
            raise
        return real, -1, -1
    return real, st.st_size, st.st_mtime_ns


def stat_key(path: pathlib.Path, *names: str) -> str:
    """A memo key for files ``names`` of directory ``path``: each one's :func:`file_id` (the
    directory itself is not part of it)."""
    parts = [SPEC_VERSION, *(":".join(map(str, file_id(path / name))) for name in names)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


_SPECS = memo("tiktoken specs", 1)  # the last spec read in this process (encoder and runtime both need it)


def tiktoken_spec(path: pathlib.Path) -> tuple[str, dict[bytes, int], dict[str, int], bool]:
    """``(pattern, ranks, added tokens, nfc)`` of a directory, memoised on disk.

    Parsing a 7 MB tokenizer.json takes most of a second; the result is kept
    as a pickle under ``$VECPACK_CACHE/tiktoken`` (keyed by the file's path,
    size and mtime) so that each worker process starts in well under that.
    A tokenizer outside these tables is memoised too, as the reason why: a
    SentencePiece-style tokenizer.json is parsed once, not at every call.

    Raises:
        Unsupported: the tokenizer is outside what tiktoken reproduces.
    """
    key = stat_key(path, "tokenizer.json")
    hit = _SPECS.get(key)
    if hit is None:
        memo_file = cache_root() / "tiktoken" / f"{key}.spec.pkl"
        hit = read_memo(memo_file, lambda o: type(o) is str or (type(o) is tuple and len(o) == 4))
        if hit is MISSING:
            try:
                hit = _parse_spec(path)
            except Unsupported as e:
                hit = str(e)
            write_memo(memo_file, hit)
        _SPECS[key] = hit
    if type(hit) is str:
        raise Unsupported(hit)
    return hit


def _parse_spec(path: pathlib.Path) -> tuple[str, dict[bytes, int], dict[str, int], bool]:
    """:func:`tiktoken_spec`, parsed from ``tokenizer.json``."""
    spec = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    added_list = spec.get("added_tokens", ())
    for t in added_list:
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            raise Unsupported(f"added token {t['content']!r} strips spaces or matches single words")
        if t.get("normalized", True) and spec.get("normalizer"):
            raise Unsupported(f"added token {t['content']!r} is matched after normalization")
    added = {t["content"]: t["id"] for t in added_list}
    contents = sorted(added)
    for a, b in zip(contents, contents[1:]):
        if b.startswith(a):
            raise Unsupported(f"added token {a!r} is a prefix of {b!r}")
    pattern, ranks, nfc = tiktoken_parts(spec)
    return pattern, ranks, added, nfc


_DERIVED = memo("tiktoken spec parts", 3)  # the last facts, Latin-script and BPE tables read in this process


def derived(path: pathlib.Path, suffix: str, derive):
    """``derive(tiktoken_spec(path))``, memoised on disk beside the spec as ``<key>.<suffix>.pkl``."""
    key = stat_key(path, "tokenizer.json")
    hit = _DERIVED.get((key, suffix))
    if hit is not None:
        return hit[1]
    memo_file = cache_root() / "tiktoken" / f"{key}.{suffix}.pkl"
    out = read_memo(memo_file, lambda o: type(o) is tuple and len(o) == 2 and o[0] == suffix)
    if out is MISSING:
        out = (suffix, derive(tiktoken_spec(path)))
        write_memo(memo_file, out)
    _DERIVED[(key, suffix)] = out
    return out[1]


def tiktoken_facts(path: pathlib.Path) -> tuple[str, dict[str, int], bool, np.ndarray]:
    """``(pattern, added tokens, nfc, bytes per token id)``: :func:`tiktoken_spec` without its ranks.

    All that a runtime needs when fastokens encodes (built from
    :func:`tiktoken_file`) or tiktoken starts on :func:`latin_table`. Its
    memo reads faster than the ranks' memo.

    Raises:
        Unsupported: as :func:`tiktoken_spec`.
    """
    def facts(spec):
        pattern, ranks, added, nfc = spec
        return pattern, added, nfc, byte_lengths(ranks, added)

    return derived(pathlib.Path(path), "facts", facts)


def latin_table(path: pathlib.Path) -> dict[bytes, int]:
    """The ranks that Latin-script texts can use (:func:`vecpack.tokenizing.latin.latin_ranks`),
    memoised on disk like :func:`tiktoken_spec`.

    Raises:
        Unsupported: as :func:`tiktoken_spec`.
    """
    return derived(pathlib.Path(path), "latin", lambda spec: latin_ranks(spec[1]))


def tiktoken_file(path: pathlib.Path) -> pathlib.Path:
    """The tokenizer's ranks as a ``.tiktoken`` file (base64 bytes, rank per line), memoised on disk.

    What :class:`fastokens.Tokenizer.from_tiktoken` reads: about half the time
    of building from ``tokenizer.json``.

    Raises:
        Unsupported: not a tiktoken-style tokenizer, or its ranks do not run
            0, 1, 2... (which that format requires).
    """
    import base64

    key = stat_key(path, "tokenizer.json")
    out = cache_root() / "tiktoken" / f"{key}.tiktoken"
    if out.exists():
        return out
    _, ranks, _, _ = tiktoken_spec(path)
    order = sorted(ranks.items(), key=lambda kv: kv[1])
    if [r for _, r in order] != list(range(len(order))):
        raise Unsupported("the vocabulary's ranks are not 0, 1, 2, ... (fastokens needs them so)")
    text = "".join(f"{base64.b64encode(b).decode()} {r}\n" for b, r in order)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = _tmp_name(out)
        tmp.write_text(text, encoding="ascii")
        os.replace(tmp, out)
    except OSError:  # a read-only cache: a private copy
        import tempfile

        fd, name = tempfile.mkstemp(suffix=".tiktoken")
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(text)
        return pathlib.Path(name)
    return out


def _tmp_name(path: pathlib.Path) -> pathlib.Path:
    """A name beside ``path`` that no other writer uses: this process, this thread, this file's whole
    name (``<key>.pkl`` and ``<key>.tiktoken`` once shared ``<key>.<pid>.tmp``, so two threads of one
    process building both wrote each other's content into the other's memo).

    >>> _tmp_name(pathlib.Path("/c/k.pkl")).name.startswith("k.pkl.")
    True
    """
    import threading

    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


#: What :func:`read_memo` returns for a memo that cannot be used.
MISSING = object()


def read_memo(memo: pathlib.Path, valid=None):
    """The object pickled at ``memo``, or :data:`MISSING` (then the caller derives the object again
    and writes it with :func:`write_memo`).

    The one rule for every memo under the cache root: a file that is missing,
    cannot be unpickled (torn, foreign, written by another version) or whose
    object fails ``valid(obj)`` is not used, whatever the error.

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> read_memo(d / "none.pkl") is MISSING
    True
    >>> write_memo(d / "m.pkl", (1, 2))
    >>> read_memo(d / "m.pkl"), read_memo(d / "m.pkl", lambda o: len(o) == 3) is MISSING
    ((1, 2), True)
    >>> _ = (d / "m.pkl").write_text("IQ== 0\\n")  # not a pickle
    >>> read_memo(d / "m.pkl") is MISSING
    True
    >>> import shutil; shutil.rmtree(d)
    """
    import pickle

    try:
        with open(memo, "rb") as f:
            obj = pickle.load(f)
    except Exception:  # noqa: BLE001 - missing, torn or foreign: derived again
        return MISSING
    return obj if valid is None or valid(obj) else MISSING


def write_memo(memo: pathlib.Path, obj) -> None:
    """Pickle ``obj`` to ``memo`` atomically (a read-only cache only makes start-ups slower)."""
    import pickle

    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = _tmp_name(memo)
        with open(tmp, "wb") as f:
            pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, memo)
    except OSError:
        pass


def default_pad_id(tokenizer, encoder) -> int:
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


def tokenizer_dir(tokenizer) -> str | None:
    """``tokenizer`` as a directory holding ``tokenizer.json``, else None (an object, or no file)."""
    if not isinstance(tokenizer, (str, os.PathLike)):
        return None
    path = os.fspath(tokenizer)
    return path if os.path.isfile(os.path.join(path, "tokenizer.json")) else None
