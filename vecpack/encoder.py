"""Chat rows -> ``(tokens, labels)`` int32 arrays, token-for-token equal to transformers.

:class:`ChatEncoder` is what every worker runs on every row::

    row ──to_messages──▶ messages ──ChatTemplate──▶ ["<|im_start|>user\\n", "Hi", ..., "Yo", "<|im_end|>", "\\n"]
                                                      (text, trainable) pieces, joined = apply_chat_template text
        ──tiktoken / tokenizers──▶ tokens  [151644, 872, 198, 13048, ..., 56, 78, 151645, 198]
        ──byte spans──────────────▶ labels [ -100, -100, -100, -100, ..., 56, 78, 151645, -100]

``tokens`` equals ``AutoTokenizer.from_pretrained(dir).apply_chat_template(
messages, tokenize=True)["input_ids"]``: the whole rendered string is
tokenized at once, so text inside a message that spells an added token
(``"<|im_end|>"`` in a user message) becomes that token, exactly as
transformers does it.

Backends. ``"tiktoken"``: for byte-level BPE tokenizers whose merges follow
their ranks (Qwen2/2.5/3, Llama 3, the GPT-2 family, Mistral Tekken) a
tiktoken ``Encoding`` is built from the tokenizer's own ``tokenizer.json``
(vocabulary through the byte-level map, pre-tokenizer regex, added tokens,
NFC when the normalizer asks for it) and checked against HF ``tokenizers``
on probe strings and on the dataset's own rows before it is used.
``"tokenizers"``: anything else, or any difference in that check, runs HF
``tokenizers`` itself; :attr:`ChatEncoder.backend_reason` says why.

Labels. A token is trained (label = token id, else ``-100``) when at least
one of its bytes lies in a trainable piece of the rendered text (the rule
transformers uses for ``return_assistant_tokens_mask``). Byte positions come
from a per-id byte-length table and a cumulative sum. So a token that
straddles a boundary, like ``"\\n\\n"`` made of the template's ``"\\n"`` and a
reply's leading ``"\\n"``, is trained. With NFC normalization, offsets are
those of the normalized text.

A conversation prefix that holds only template text and the system prompt
(the same in many rows) is tokenized once per process and reused.

>>> from vecpack.testing import cached_tokenizer_dir          # doctest: +SKIP
>>> enc = ChatEncoder.from_tokenizer(cached_tokenizer_dir("qwen2.5"))  # doctest: +SKIP
>>> tokens, labels = enc.encode_row({"conversations": [
...     {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]})  # doctest: +SKIP
>>> enc.backend, tokens.dtype, int((labels != -100).sum())    # doctest: +SKIP
('tiktoken', dtype('int32'), 3)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import re
import unicodedata
import warnings

import numpy as np

from .errors import InputError
from .formats import STYLES, to_messages
from .sources import _orjson_loads
from .template import MASKINGS, ChatTemplate

__all__ = ["BACKENDS", "ChatEncoder", "tiktoken_ids"]

#: Encoding engines, in order of preference.
BACKENDS = ("tiktoken", "tokenizers")

_VERSION = "vecpack-chat-encoder-1"
_SPECIAL_ATTRS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_MAX_SAMPLE_ROWS = 256         # rows of the dataset the self-checks look at
_PREFIX_CACHE_MAX = 1024        # cached conversation prefixes per process
_PREFIX_MAX_CHARS = 32_768      # longer prefixes are not cached


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies are written in)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


# --------------------------------------------------------------------------- loading


def _token_text(value):
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_dir(path: pathlib.Path) -> tuple[str | None, dict]:
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


def _cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("VECPACK_CACHE") or pathlib.Path.home() / ".cache" / "vecpack")


def _materialize(tokenizer) -> pathlib.Path:
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
    out = _cache_root() / "tokenizers" / digest
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


class _Unsupported(Exception):
    """The tokenizer is outside what the tiktoken backend reproduces."""


def _byte_level(spec: dict) -> tuple[dict[bytes, int], bool, list[dict]]:
    """``(vocabulary as bytes, nfc, pre-tokenizer steps)`` of a byte-level BPE tokenizer.json.

    Every token of such a tokenizer stands for fixed bytes, and the tokens of
    a text spell its bytes (NFC-normalized when ``nfc``).

    Raises:
        _Unsupported: saying which feature breaks that.
    """
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise _Unsupported(f"model is {model.get('type')}, not BPE")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise _Unsupported(f"BPE option {key}={model[key]!r}")
    if model.get("byte_fallback"):
        raise _Unsupported("byte_fallback BPE (SentencePiece style)")
    norm = spec.get("normalizer")
    if norm and norm.get("type") == "Sequence" and len(norm.get("normalizers", ())) == 1:
        norm = norm["normalizers"][0]
    if norm and norm.get("type") != "NFC":
        raise _Unsupported(f"normalizer {norm.get('type')}")
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("add_prefix_space"):
        raise _Unsupported("pre-tokenizer is not a byte-level regex split")
    b2u = _bytes_to_unicode()
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
            raise _Unsupported(f"vocabulary entry {text!r} is not byte-level") from None
    return ranks, bool(norm), steps


def _tiktoken_parts(spec: dict) -> tuple[str, dict[bytes, int], bool]:
    """``(pattern, mergeable ranks, nfc)`` for tiktoken, from a parsed tokenizer.json.

    Raises:
        _Unsupported: saying which feature tiktoken cannot reproduce.
    """
    ranks, nfc, steps = _byte_level(spec)
    if len(steps) == 1 and steps[0].get("use_regex", True):
        pattern = _GPT2_PATTERN
    elif (len(steps) == 2 and steps[0].get("type") == "Split" and not steps[1].get("use_regex", True)
          and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert")
          and "Regex" in (steps[0].get("pattern") or {})):
        pattern = steps[0]["pattern"]["Regex"]
    else:
        raise _Unsupported("pre-tokenizer is not a byte-level regex split")
    if any(bytes([b]) not in ranks for b in range(256)):
        raise _Unsupported("the vocabulary lacks some single bytes")
    vocab = spec["model"]["vocab"]
    last = -1
    for merge in spec["model"].get("merges", ()):
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        rank = vocab.get(a + b)
        if rank is None or rank < last:
            raise _Unsupported(f"merges do not follow vocabulary ranks (at {a!r} + {b!r})")
        last = rank
    return pattern, ranks, nfc


def _byte_lengths(ranks: dict[bytes, int], added: dict[str, int]) -> np.ndarray:
    """int64 [vocab]: how many bytes each token id spells (0 for unused ids)."""
    size = max([*ranks.values(), *added.values()]) + 1
    out = np.zeros(size, dtype=np.int64)
    out[np.fromiter(ranks.values(), np.int64, len(ranks))] = np.fromiter(map(len, ranks), np.int64,
                                                                          len(ranks))
    for text, idx in added.items():
        out[idx] = len(text.encode("utf-8"))
    return out


def _hf_byte_table(path: pathlib.Path) -> tuple[np.ndarray, bool] | None:
    """``(bytes per token id, nfc)`` for the HF-tokenizers backend, or None.

    Given for byte-level BPE tokenizers (see :func:`_byte_level`): HF
    tokenizers then only has to produce ids (``encode_batch_fast``, ~15%
    faster than ``encode``) and labels come from byte spans, as with tiktoken.
    Memoised on disk like :func:`_tiktoken_spec`.
    """
    import pickle

    key = _stat_key(path, "tokenizer.json")
    memo = _cache_root() / "encoder" / f"{key}-bytes.pkl"
    try:
        with open(memo, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        pass
    try:
        spec = (_orjson_loads or json.loads)((path / "tokenizer.json").read_bytes())
        ranks, nfc, _ = _byte_level(spec)
        out = (_byte_lengths(ranks, {t["content"]: t["id"] for t in spec.get("added_tokens", ())}), nfc)
    except (_Unsupported, OSError, ValueError, KeyError, TypeError, AttributeError):
        out = None
    _write_memo(memo, out)
    return out


class _BoundedDict(dict):
    """A dict that forgets everything when it reaches ``limit`` entries (cheap and bounded)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def __setitem__(self, key, value):
        if len(self) >= self.limit:
            self.clear()
        super().__setitem__(key, value)


def _stat_key(path: pathlib.Path, *names: str) -> str:
    """A memo key for files of ``path``: its resolved path and each file's size and mtime."""
    parts = [_VERSION, str(path.resolve())]
    for name in names:
        try:
            st = (path / name).stat()
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{name}:-")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


_SPECS: dict = {}  # the last spec read in this process (from_tokenizer and _Runtime both need it)


def _tiktoken_spec(path: pathlib.Path) -> tuple[str, dict[bytes, int], dict[str, int], bool]:
    """``(pattern, ranks, added tokens, nfc)`` of a directory, memoised on disk.

    Parsing a 7 MB tokenizer.json takes most of a second; the result is kept
    as a pickle under ``$VECPACK_CACHE/tiktoken`` (keyed by the file's path,
    size and mtime) so that each worker process starts in well under that.

    Raises:
        _Unsupported: the tokenizer is outside what tiktoken reproduces.
    """
    import pickle

    key = _stat_key(path, "tokenizer.json")
    hit = _SPECS.get(key)
    if hit is not None:
        return hit
    memo = _cache_root() / "tiktoken" / f"{key}.pkl"
    try:
        with open(memo, "rb") as f:
            out = pickle.load(f)
        _SPECS.clear()  # one tokenizer's tables at a time
        _SPECS[key] = out
        return out
    except (OSError, EOFError, pickle.UnpicklingError):
        pass
    spec = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    added_list = spec.get("added_tokens", ())
    for t in added_list:
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            raise _Unsupported(f"added token {t['content']!r} strips spaces or matches single words")
        if t.get("normalized", True) and spec.get("normalizer"):
            raise _Unsupported(f"added token {t['content']!r} is matched after normalization")
    added = {t["content"]: t["id"] for t in added_list}
    contents = sorted(added)
    for a, b in zip(contents, contents[1:]):
        if b.startswith(a):
            raise _Unsupported(f"added token {a!r} is a prefix of {b!r}")
    pattern, ranks, nfc = _tiktoken_parts(spec)
    out = (pattern, ranks, added, nfc)
    _write_memo(memo, out)
    return out


def _write_memo(memo: pathlib.Path, obj) -> None:
    """Pickle ``obj`` to ``memo`` atomically (a read-only cache only makes start-ups slower)."""
    import pickle

    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, memo)
    except OSError:
        pass


def _hf_facts(path: pathlib.Path, variables: dict) -> dict:
    """What the encoder needs from HF ``tokenizers``, memoised on disk per tokenizer file.

    ``{"added": [added token contents], "ids": {token text: id or None},
    "affixes": (prefix ids, suffix ids)}`` where the affixes are what the
    post-processor adds around a text (``<|begin_of_text|>`` for Llama 3).
    Loading Qwen's 151k merges into HF ``tokenizers`` takes most of a second,
    so the facts are kept under ``$VECPACK_CACHE/encoder`` (keyed by the
    files' path, size and mtime); a new process then builds its encoder
    without loading HF ``tokenizers`` at all.
    """
    import pickle

    wanted = sorted(set(variables.values()))
    key = _stat_key(path, "tokenizer.json", "tokenizer_config.json")
    memo = _cache_root() / "encoder" / f"{key}.pkl"
    try:
        with open(memo, "rb") as f:
            facts = pickle.load(f)
        if all(t in facts["ids"] for t in wanted):
            return facts
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError):
        pass
    hf = _runtime(str(path), "tokenizers").load_tokenizers(path)
    bare = hf.encode("x", add_special_tokens=False).ids
    full = hf.encode("x", add_special_tokens=True).ids
    cut = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare), None)
    facts = {"added": _added(hf), "ids": {t: hf.token_to_id(t) for t in wanted},
             "affixes": ((), ()) if cut is None else (tuple(full[:cut]), tuple(full[cut + len(bare):]))}
    _write_memo(memo, facts)
    return facts


def tiktoken_ids(path: str, texts) -> list[list[int]] | str:
    """The tiktoken engine's ids of each of ``texts``, or why there are none."""
    try:
        rt = _runtime(path, "tiktoken")
    except _Unsupported as e:
        return str(e)
    out = []
    for text in texts:
        try:
            out.append(rt.encode_tiktoken(text))
        except Exception as e:  # pragma: no cover - engine bug
            return f"tiktoken failed on a sample ({type(e).__name__}: {e})"
    return out


class _Runtime:
    """Per-process state of an encoder: the engine, tables and caches (never pickled)."""

    def __init__(self, path: pathlib.Path, backend: str):
        self.tk = None
        self.core = None
        self.bytelen = None
        self.nfc = False
        self.prefix_cache = _BoundedDict(_PREFIX_CACHE_MAX)
        if backend != "tiktoken":
            tk = self.load_tokenizers(path)
            self.added = {t.content: i for i, t in tk.get_added_tokens_decoder().items()}
            self.special_re = None
            table = _hf_byte_table(path) if hasattr(tk, "encode_batch_fast") else None
            if table is not None:  # ids only from HF; labels from byte spans
                self.bytelen, self.nfc = table
            return
        pattern, ranks, self.added, self.nfc = _tiktoken_spec(path)
        self.special_re = (re.compile("|".join(map(re.escape, sorted(self.added, key=len, reverse=True))))
                           if self.added else None)
        self.bytelen = _byte_lengths(ranks, self.added)
        self.bytelen32 = self.bytelen.astype(np.int32)
        import tiktoken

        enc = tiktoken.Encoding(f"vecpack-{path.name}", pat_str=pattern, mergeable_ranks=ranks,
                                special_tokens=self.added)
        self.core = enc._core_bpe
        self.allowed = frozenset(self.added)
        # a content holding none of the first two characters of any added token holds no added token
        pairs = sorted({t[:2] for t in self.added})
        self.heads = tuple((ch, tuple(p for p in pairs if p[0] == ch)) for ch in sorted({p[0] for p in pairs}))
        self.partial_heads = frozenset(t[:i] for t in self.added for i in range(1, len(t)))
        self.partial_tails = frozenset(t[i:] for t in self.added for i in range(1, len(t)))
        self.longest_added = max(map(len, self.added), default=0)

    def load_tokenizers(self, path: pathlib.Path):
        if self.tk is None:
            from tokenizers import Tokenizer

            self.tk = Tokenizer.from_file(str(path / "tokenizer.json"))
        return self.tk

    def cache_prefix(self, prefix: str) -> tuple[int, np.ndarray]:
        """``(k, ids)``: ``prefix[:k]`` ends right after its last added token, ``ids`` its tokens.

        Text after an added token tokenizes independently of what precedes
        it, so ``ids + encode(text[k:]) == encode(text)`` for any ``text``
        starting with ``prefix[:k]``.
        """
        k = 0
        for m in self.special_re.finditer(prefix) if self.special_re is not None else ():
            k = m.end()
        return k, np.array(self.encode_tiktoken(prefix[:k]), dtype=np.int32)

    def encode_tiktoken(self, text: str) -> list[int]:
        """tiktoken ids of ``text`` with added tokens recognized anywhere (NFC per piece if needed)."""
        if self.nfc and not text.isascii() and not unicodedata.is_normalized("NFC", text):
            out, prev = [], 0
            for m in (self.special_re.finditer(text) if self.special_re else ()):
                if m.start() > prev:
                    out += self.core.encode_ordinary(unicodedata.normalize("NFC", text[prev:m.start()]))
                out.append(self.added[m.group()])
                prev = m.end()
            if prev < len(text):
                out += self.core.encode_ordinary(unicodedata.normalize("NFC", text[prev:]))
            return out
        return self.core.encode(text, self.allowed)


_RUNTIMES: dict[tuple, _Runtime] = {}


def _runtime(path: str, backend: str) -> _Runtime:
    p = pathlib.Path(path)
    st = (p / "tokenizer.json").stat()
    key = (str(p), backend, st.st_size, st.st_mtime_ns)
    rt = _RUNTIMES.get(key)
    if rt is None:
        while len(_RUNTIMES) >= 4:
            _RUNTIMES.pop(next(iter(_RUNTIMES)))
        rt = _RUNTIMES[key] = _Runtime(p, backend)
    return rt


# --------------------------------------------------------------------------- the encoder


class ChatEncoder:
    """Encode chat rows into ``(tokens, labels)`` exactly as transformers would.

    Build it with :meth:`from_tokenizer`. It pickles as its configuration (a
    tokenizer path and a few options) and rebuilds its engine lazily, once
    per process, so it can be shipped to every worker.

    Attributes:
        backend: ``"tiktoken"`` or ``"tokenizers"``.
        backend_reason: why the tiktoken backend is not used (``""`` if it is).
        path: the tokenizer directory.
        style, column, masking: how rows are read and which tokens are trained.
        template: the :class:`~vecpack.template.ChatTemplate` (``None`` for the
            text style); ``template.mode`` is ``"compiled"`` or ``"jinja"``.
        eos_id, pad_id, bos_id: special token ids (``None`` when absent;
            ``pad_id`` falls back to ``eos_id``).
        fingerprint: a hash of everything that determines the output.
        pending_check: with ``from_tokenizer(defer_check=True)``, the sample
            texts whose parity check has not run yet (``None`` once
            :meth:`check` ran, or when there is nothing to check).
    """

    def __init__(self, path, *, masking: str = "assistant", style: str = "sharegpt", column: str | None = None,
                 backend: str = "tiktoken", backend_reason: str = "", template: ChatTemplate | None = None,
                 text_affixes: tuple[tuple[int, ...], tuple[int, ...]] = ((), ()),
                 ids: dict | None = None):
        if masking not in MASKINGS:
            raise ValueError(f"masking must be one of {list(MASKINGS)}, got {masking!r}")
        if style not in STYLES:
            raise ValueError(f"style must be one of {list(STYLES)}, got {style!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
        self.path = str(path)
        self.masking = masking
        self.style = style
        self.column = column
        self.backend = backend
        self.backend_reason = backend_reason
        self.template = template
        self.text_affixes = (tuple(text_affixes[0]), tuple(text_affixes[1]))
        ids = ids or {}
        self.bos_id, self.eos_id, self.pad_id = ids.get("bos"), ids.get("eos"), ids.get("pad")
        self.pending_check = None  # sample texts of a deferred parity check (see from_tokenizer)
        self._rt = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_tokenizer(cls, tokenizer, *, masking: str = "assistant", style: str = "sharegpt",
                       column: str | None = None, sample_rows=None, backend: str = "auto",
                       defer_check: bool = False) -> "ChatEncoder":
        """Build an encoder and choose its backend.

        Args:
            tokenizer: a local HF tokenizer directory (``tokenizer.json`` +
                ``tokenizer_config.json``) or a fast transformers tokenizer.
            masking: ``"assistant"``, ``"last"`` or ``"all"``.
            style, column: see :func:`vecpack.formats.to_messages`.
            sample_rows: rows of the dataset to self-check on (the tiktoken
                backend against HF tokenizers, the compiled template against
                Jinja); rows that cannot be read are ignored here.
            backend: ``"auto"`` (tiktoken if it passes the checks),
                ``"tiktoken"`` (error if unsupported or different) or
                ``"tokenizers"``.
            defer_check: leave the parity check of tiktoken against HF
                ``tokenizers`` for later: the encoder comes back with
                ``backend == "tiktoken"`` and ``pending_check`` set, and the
                caller must run :meth:`check` before trusting its output and,
                if it returns a reason, use :meth:`fallback` instead (this is
                what :func:`vecpack.tokenize` does, overlapping the check with
                the tokenizing).

        >>> enc = ChatEncoder.from_tokenizer(qwen_dir, sample_rows=rows)  # doctest: +SKIP
        >>> enc.backend                                                   # doctest: +SKIP
        'tiktoken'
        """
        if backend not in ("auto", *BACKENDS):
            raise ValueError(f"backend must be 'auto', 'tiktoken' or 'tokenizers', got {backend!r}")
        if masking not in MASKINGS:
            raise ValueError(f"masking must be one of {list(MASKINGS)}, got {masking!r}")
        if style not in STYLES:
            raise ValueError(f"style must be one of {list(STYLES)}, got {style!r}")
        if isinstance(tokenizer, (str, os.PathLike)):
            path = pathlib.Path(tokenizer).expanduser().resolve()
            if not (path / "tokenizer.json").exists():
                raise ValueError(f"tokenizer directory {str(path)!r} has no tokenizer.json "
                                 "(vecpack needs a fast Hugging Face tokenizer)")
        else:
            path = _materialize(tokenizer)
        source, variables = _read_dir(path)
        facts = _hf_facts(path, variables)
        template = None
        if style != "text":
            if not source:
                raise ValueError(f"tokenizer {str(path)!r} has no chat_template; use style='text' or add one")
            template = ChatTemplate(source, variables=variables, added_tokens=facts["added"],
                                    masking=masking)
        ids = {k: (facts["ids"].get(variables[f"{k}_token"]) if variables.get(f"{k}_token") else None)
               for k in ("bos", "eos", "pad")}
        if ids["pad"] is None:
            ids["pad"] = ids["eos"]
        affixes = facts["affixes"]
        enc = cls(path, masking=masking, style=style, column=column, backend="tokenizers",
                  template=template, text_affixes=affixes, ids=ids)

        conversations = enc._conversations(sample_rows)
        if template is not None and conversations:
            template.verify(conversations)
        texts = enc._texts(conversations)
        if backend == "tokenizers":
            return enc
        enc._strict = backend == "tiktoken"
        if defer_check:
            try:  # what can be decided without HF tokenizers is decided now
                _tiktoken_spec(path)
            except _Unsupported as e:
                return enc.fallback(str(e), stacklevel=3)
            enc.backend = "tiktoken"
            enc.pending_check = tuple(texts)
            return enc
        from .parity import reason as parity_reason

        reason = parity_reason(str(enc.path), texts)
        if reason:
            return enc.fallback(reason, stacklevel=3)
        enc.backend = "tiktoken"
        enc._rt = None
        return enc

    def _conversations(self, rows) -> list[list[dict]]:
        out = []
        for row in itertools.islice(rows or (), _MAX_SAMPLE_ROWS):
            try:
                out.append(to_messages(row, self.style, self.column))
            except InputError:
                continue
        return out

    def _texts(self, conversations) -> list[str]:
        texts = []
        for msgs in conversations:
            try:
                texts.append(msgs[0]["content"] if self.template is None else self.template.render(msgs))
            except InputError:
                continue
        return texts

    def sample_texts(self, rows) -> list[str]:
        """The rendered texts of (up to 256 of) ``rows`` that a parity check compares."""
        return self._texts(self._conversations(rows))

    def fallback(self, reason: str, *, stacklevel: int = 2) -> "ChatEncoder":
        """This encoder on the HF ``tokenizers`` backend, because of ``reason`` (warns).

        Raises:
            ValueError: the tiktoken backend was asked for explicitly.
        """
        if self.__dict__.get("_strict"):
            raise ValueError(f"the tiktoken backend cannot reproduce this tokenizer: {reason}")
        warnings.warn(f"vecpack: using HF tokenizers (slower): {reason}", RuntimeWarning,
                      stacklevel=stacklevel)
        out = ChatEncoder.__new__(ChatEncoder)
        out.__dict__.update(self.__dict__)
        out.backend, out.backend_reason, out.pending_check, out._rt = "tokenizers", reason, None, None
        out.__dict__.pop("_fingerprint", None)
        return out

    def check(self) -> str:
        """Run the deferred parity check (see ``defer_check``); ``""`` if tiktoken passed."""
        texts = self.pending_check
        if texts is None:
            return self.backend_reason
        from .parity import reason as parity_reason

        reason = parity_reason(str(self.path), texts)
        self.pending_check = None
        return reason

    # ------------------------------------------------------------------ pickling

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_rt"] = None
        state["pending_check"] = None  # the driver runs it; workers never do
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    @property
    def runtime(self) -> _Runtime:
        rt = self._rt
        if rt is None:
            rt = self._rt = _runtime(self.path, self.backend)
            if self.backend == "tokenizers":
                rt.load_tokenizers(pathlib.Path(self.path))
        return rt

    @property
    def fingerprint(self) -> str:
        """A hash of the tokenizer files and every option that changes the output."""
        key = (self.masking, self.style, self.column, self.text_affixes)
        memo = self.__dict__.get("_fingerprint")
        if memo is not None and memo[0] == key:
            return memo[1]
        h = hashlib.sha256(_VERSION.encode())
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            p = pathlib.Path(self.path) / name
            h.update(name.encode() + b"\0" + (p.read_bytes() if p.exists() else b"") + b"\0")
        h.update(repr(key).encode())
        self._fingerprint = (key, h.hexdigest())
        return self._fingerprint[1]

    def __repr__(self) -> str:
        mode = self.template.mode if self.template is not None else "text"
        return (f"ChatEncoder({self.path!r}, style={self.style!r}, masking={self.masking!r}, "
                f"backend={self.backend!r}, template={mode!r})")

    # ------------------------------------------------------------------ encoding

    def encode_row(self, row: dict) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of one dataset row.

        Raises:
            InputError: the row is unusable (reason only; the caller adds the location).
        """
        return self.encode_messages(to_messages(row, self.style, self.column))

    def encode_messages(self, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of a conversation ``[{"role", "content"}, ...]``.

        ``tokens`` are int32 and equal ``apply_chat_template(messages,
        tokenize=True)``; ``labels`` are ``tokens`` where trained, else -100.
        """
        if self.template is None:
            if len(messages) != 1:
                raise InputError("the text style takes exactly one text per row")
            return self._encode_text(messages[0]["content"])
        parts, train, n_cache, layout = self._parts(messages)
        if self.backend == "tiktoken":
            return self._encode_tiktoken(parts, train, n_cache, layout)
        return self._encode_tokenizers(parts, train)

    def _parts(self, messages):
        """``template.parts(messages)``, with a malformed message as an :class:`InputError`."""
        try:
            return self.template.parts(messages)
        except (KeyError, TypeError) as e:
            raise InputError(f"malformed message: {e!r}") from None

    def _encode_text(self, text: str):
        rt = self.runtime
        if self.backend == "tiktoken":
            ids = rt.encode_tiktoken(text)
        else:
            ids = (self._hf_ids(text).tolist() if hasattr(rt.tk, "encode_batch_fast")
                   else rt.tk.encode(text, add_special_tokens=False).ids)
        pre, post = self.text_affixes
        ids = [*pre, *ids, *post]
        if self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids.append(self.eos_id)
        tokens = np.array(ids, dtype=np.int32)
        return tokens, tokens.copy()

    def _allowed(self, layout, parts) -> frozenset:
        """The added tokens that can occur in this row (tiktoken pays per allowed token and call).

        The ones in the layout's literals, unless a content holds the first
        two characters of an added token or a literal could join a content
        into one (then all of them).
        """
        rt = self.runtime
        memo = layout.memo.get("allowed")
        if memo is None:
            memo = layout.memo["allowed"] = _literal_specials(layout, rt)
        if memo is False:
            return rt.allowed
        heads = rt.heads
        for pos, _, _ in layout.slots:
            c = parts[pos]
            for first, pairs in heads:
                if first in c:  # a one-character search first: memchr-fast, usually a miss
                    for h in pairs:
                        if h in c:
                            return rt.allowed
        return memo

    def _tiktoken_ids(self, parts, n_cache, layout=None):
        """``(head, ids, ascii_only, nfc_fix)``: the row's tokens are ``head`` (cached prefix
        ids, or None) followed by ``ids`` (may be a read-only view of tiktoken's buffer)."""
        rt = self.runtime
        text = "".join(parts)
        ascii_only = text.isascii()
        nfc_fix = rt.nfc and not ascii_only and not unicodedata.is_normalized("NFC", text)
        try:
            if nfc_fix:
                return None, np.array(rt.encode_tiktoken(text), dtype=np.int32), ascii_only, True
            k, head = 0, None
            if n_cache:
                c = sum(map(len, parts[:n_cache])) if n_cache > 1 else len(parts[0])
                if 0 < c <= _PREFIX_MAX_CHARS:
                    key = text[:c]
                    hit = rt.prefix_cache.get(key)
                    if hit is None:
                        hit = rt.prefix_cache[key] = rt.cache_prefix(key)
                    k, head = hit
            allowed = rt.allowed if layout is None else self._allowed(layout, parts)
            buf = rt.core.encode_to_tiktoken_buffer(text[k:] if k else text, allowed)
        except UnicodeEncodeError:
            raise InputError("text contains a lone surrogate (invalid Unicode)") from None
        return (head if k else None), np.frombuffer(buf, dtype=np.int32), ascii_only, False

    def _encode_tiktoken(self, parts, train, n_cache, layout=None):
        rt = self.runtime
        head, ids, ascii_only, nfc_fix = self._tiktoken_ids(parts, n_cache, layout)
        tokens = np.concatenate((head, ids)) if head is not None else ids.copy()
        if self.masking == "all":
            return tokens, tokens.copy()
        spans, _ = _byte_spans(parts, train, ascii_only, nfc_fix, None if layout is None else layout.nbytes,
                               _layout_runs(layout, train))
        ends = rt.bytelen.take(tokens).cumsum() if spans and len(tokens) else None
        return tokens, _span_labels(tokens, spans, ends)

    def chunk_sink(self) -> "_ChunkSink | None":
        """A collector that encodes many rows and makes their labels in one vectorized pass.

        ``None`` when this encoder has no such path (HF tokenizers backend, text
        style); callers then use :meth:`encode_row`. The result is identical.
        """
        if self.backend != "tiktoken" or self.template is None:
            return None
        return _ChunkSink(self)

    def _encode_tokenizers(self, parts, train):
        rt = self.runtime
        text = "".join(parts)
        if rt.bytelen is not None:  # byte-level BPE: ids only, labels from byte spans
            tokens = self._hf_ids(text)
            if self.masking == "all":
                return tokens, tokens.copy()
            labels = self._byte_labels(parts, train, text, tokens)
            if labels is not None:
                return tokens, labels
        try:
            enc = rt.tk.encode(text, add_special_tokens=False)
        except Exception as e:
            raise InputError(f"HF tokenizers cannot encode this row: {e}") from None
        tokens = np.array(enc.ids, dtype=np.int32)
        if self.masking == "all":
            return tokens, tokens.copy()
        labels = np.full(len(tokens), -100, dtype=np.int32)
        spans, pos = [], 0
        for p, t in zip(parts, train):
            if t and p:
                if spans and spans[-1][1] == pos:
                    spans[-1] = (spans[-1][0], pos + len(p))
                else:
                    spans.append((pos, pos + len(p)))
            pos += len(p)
        if spans and len(tokens):
            if not _label_runs(enc, spans, tokens, labels):
                offsets = np.array(enc.offsets, dtype=np.int64).reshape(-1, 2)
                for a, b in spans:
                    mask = (offsets[:, 0] < b) & (offsets[:, 1] > a)
                    labels[mask] = tokens[mask]
        return tokens, labels

    def _hf_ids(self, text: str) -> np.ndarray:
        """HF tokenizers' ids of ``text`` (no offsets: ``encode_batch_fast``), int32."""
        try:
            enc = self.runtime.tk.encode_batch_fast([text], add_special_tokens=False)[0]
        except Exception as e:
            raise InputError(f"HF tokenizers cannot encode this row: {e}") from None
        return np.array(enc.ids, dtype=np.int32)

    def _byte_labels(self, parts, train, text, tokens) -> np.ndarray | None:
        """Labels by the byte-span rule of the tiktoken path, or None when the tokens
        do not spell the (normalized) text byte for byte: the caller then asks HF for offsets."""
        rt = self.runtime
        ascii_only = text.isascii()
        nfc = rt.nfc and not ascii_only and not unicodedata.is_normalized("NFC", text)
        spans, total = _byte_spans(parts, train, ascii_only, nfc)
        if len(tokens) and int(tokens.max()) >= len(rt.bytelen):
            return None
        ends = rt.bytelen.take(tokens).cumsum()
        if (int(ends[-1]) if len(ends) else 0) != total:
            return None
        return _span_labels(tokens, spans, ends)


def _label_runs(enc, spans, tokens, labels) -> bool:
    """Label the tokens overlapping each character span, asking the ``Encoding`` only
    about the span edges (turning every offset into Python costs ~15% of a row).

    The trained tokens of ``[a, b)`` are those whose offsets overlap it: from
    the token holding character ``a`` back over any token that shares it (a
    character split over byte tokens), to the token holding ``b - 1`` and on
    over any that shares it. Returns False (labels untouched) when an edge
    character has no token (removed by a normalizer) or the offsets are not in
    order: the caller then compares every offset.
    """
    n = len(tokens)
    runs = []
    for a, b in spans:
        i, j = enc.char_to_token(a), enc.char_to_token(b - 1)
        if i is None or j is None or j < i:
            return False
        while i > 0:
            prev = enc.token_to_chars(i - 1)
            if prev is None or prev[1] <= a:
                break
            if prev[0] >= b:
                return False
            i -= 1
        while j + 1 < n:
            nxt = enc.token_to_chars(j + 1)
            if nxt is None or nxt[0] >= b:
                break
            if nxt[1] <= a:
                return False
            j += 1
        runs.append((i, j + 1))
    for i, j in runs:
        labels[i:j] = tokens[i:j]
    return True


def _added(tk) -> list[str]:
    return [t.content for t in tk.get_added_tokens_decoder().values()]


def _literal_specials(layout, rt: "_Runtime"):
    """Added tokens inside a layout's literals, or ``False`` if one could span a literal and a content."""
    slots = [pos for pos, _, _ in layout.slots]
    bounds = [-1, *slots, len(layout.parts)]
    found = set()
    for g in range(len(bounds) - 1):
        text = "".join(layout.parts[bounds[g] + 1:bounds[g + 1]])  # the literals between two contents
        if not text and 0 < g < len(bounds) - 2:
            return False  # adjacent contents: a token could start in one and end in the other
        found.update(tok for tok in rt.added if tok in text)
        longest = min(len(text), rt.longest_added - 1)
        if g < len(bounds) - 2 and any(text[-i:] in rt.partial_heads for i in range(1, longest + 1)):
            return False  # "...<|im_" + content
        if g > 0 and any(text[:i] in rt.partial_tails for i in range(1, longest + 1)):
            return False  # content + "_end|>..."
    return frozenset(found)


class _ChunkSink:
    """The rows of one chunk, encoded: token pieces and trained byte spans.

    Per row, :meth:`add` only tokenizes and notes where the trained bytes
    are; :meth:`finish` concatenates the tokens once and turns every byte span
    into a label range with one ``cumsum`` and two ``searchsorted`` over the
    whole chunk (the per-row rule of :meth:`ChatEncoder.encode_row`, in bulk).
    """

    def __init__(self, encoder: ChatEncoder):
        self.enc = encoder
        self.rt = encoder.runtime
        self.pieces: list[np.ndarray] = []
        self.starts: list[int] = []      # trained byte spans, in chunk byte coordinates
        self.stops: list[int] = []
        self.nbytes = 0                  # bytes of the rows added so far

    def add(self, row) -> int:
        """Encode one row; returns its token count. Raises :class:`InputError` (nothing kept)."""
        enc = self.enc
        parts, train, n_cache, layout = enc._parts(to_messages(row, enc.style, enc.column))
        head, ids, ascii_only, nfc_fix = enc._tiktoken_ids(parts, n_cache, layout)
        spans, total = _byte_spans(parts, train, ascii_only, nfc_fix,
                                   None if layout is None else layout.nbytes, _layout_runs(layout, train))
        if nfc_fix:  # normalizing piece by piece can differ from the whole text at a boundary
            total = int(self.rt.bytelen.take(ids).sum())
        base = self.nbytes
        for a, b in spans:
            self.starts.append(base + a)
            self.stops.append(base + b)
        self.nbytes = base + total
        if head is not None:
            self.pieces.append(head)
            self.pieces.append(ids)
            return len(head) + len(ids)
        self.pieces.append(ids)
        return len(ids)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of every row added, back to back (int32).

        ``self.trainable`` is then the number of trained tokens.
        """
        tokens = np.concatenate(self.pieces) if self.pieces else np.zeros(0, np.int32)
        self.pieces = []
        n = len(tokens)
        if self.enc.masking == "all":
            self.trainable = n
            return tokens, tokens.copy()
        self.trainable = 0
        if not self.starts or not n:
            return tokens, np.full(n, -100, dtype=np.int32)
        small = self.nbytes < 2**31  # int32 byte positions: half the memory traffic
        ends = (self.rt.bytelen32 if small else self.rt.bytelen).take(tokens)
        np.cumsum(ends, out=ends)
        if int(ends[-1]) != self.nbytes:  # pragma: no cover - the tokens do not spell the text
            raise RuntimeError(f"the tokens of a chunk cover {int(ends[-1])} bytes but its text has "
                               f"{self.nbytes}")
        first, last = _token_runs(ends, self.starts, self.stops)
        mask, self.trainable = _runs_mask(first, np.minimum(last, n), n)
        return tokens, np.where(mask, tokens, np.int32(-100))


def _runs_mask(first: np.ndarray, last: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """``(mask, count)``: bool [n], True inside any run ``[first[i], last[i])``.

    Runs come in order (``first`` non-decreasing) and may overlap or touch; they
    are merged, then the mask is one ``np.repeat`` of alternating values.
    """
    reach = np.maximum.accumulate(last)
    new = np.empty(len(first), dtype=bool)
    new[0] = True
    new[1:] = first[1:] > reach[:-1]
    starts = first[new]
    stops = np.maximum.reduceat(last, np.flatnonzero(new))
    bounds = np.empty(2 * len(starts) + 2, dtype=np.int64)
    bounds[0], bounds[-1] = 0, n
    bounds[1:-1:2], bounds[2:-1:2] = starts, stops
    values = np.zeros(len(bounds) - 1, dtype=bool)
    values[1::2] = True
    return np.repeat(values, np.diff(bounds)), int((stops - starts).sum())


def _span_labels(tokens: np.ndarray, spans, ends) -> np.ndarray:
    """int32 labels of one row: the tokens overlapping any byte span, -100 elsewhere.

    ``ends`` is the tokens' cumulative byte ends (unused when there are no spans).
    """
    labels = np.full(len(tokens), -100, dtype=np.int32)
    if spans and len(tokens):
        first, last = _token_runs(ends, [a for a, _ in spans], [b for _, b in spans])
        for i, j in zip(first.tolist(), last.tolist()):
            labels[i:j] = tokens[i:j]
    return labels


def _token_runs(ends: np.ndarray, starts, stops) -> tuple[np.ndarray, np.ndarray]:
    """The token runs ``[first, last)`` that overlap byte spans ``[starts[i], stops[i])``.

    Token ``t`` covers bytes ``[ends[t] - len(t), ends[t])`` (``ends`` is the
    cumulative byte length of the tokens); it is trained if any of them is in
    a span. ``last`` may exceed ``len(ends)`` by one at the very end.
    """
    first = ends.searchsorted(np.asarray(starts, dtype=ends.dtype) + 1)
    last = ends.searchsorted(np.asarray(stops, dtype=ends.dtype)) + 1
    return first, last


def _train_runs(train) -> tuple[tuple[int, int], ...]:
    """The maximal runs ``[i, j)`` of trainable parts (fixed per compiled layout)."""
    runs, start = [], None
    for k, t in enumerate(train):
        if t and start is None:
            start = k
        elif not t and start is not None:
            runs.append((start, k))
            start = None
    if start is not None:
        runs.append((start, len(train)))
    return tuple(runs)


def _layout_runs(layout, train):
    if layout is None:
        return _train_runs(train)
    runs = layout.memo.get("runs")
    if runs is None:
        runs = layout.memo["runs"] = _train_runs(train)
    return runs


def _byte_spans(parts, train, ascii_only: bool, nfc: bool, nbytes=None,
                runs=None) -> tuple[list[tuple[int, int]], int]:
    """``(spans, total)``: trainable ``[start, end)`` byte ranges of the (normalized)
    rendered text, non-empty, in order, and its size in bytes.

    ``nbytes[i]`` (if given and >= 0) is the known UTF-8 size of ``parts[i]``;
    ``runs`` (if given) is ``_train_runs(train)``. Two spans may touch: a token
    overlapping either is trained, as if they were one.
    """
    if ascii_only:
        sizes = map(len, parts)
    elif nfc:
        sizes = (len(unicodedata.normalize("NFC", p).encode("utf-8", "surrogatepass")) for p in parts)
    elif nbytes is not None:
        sizes = (b if b >= 0 else (len(p) if p.isascii() else len(p.encode("utf-8", "surrogatepass")))
                 for p, b in zip(parts, nbytes))
    else:
        sizes = (len(p) if p.isascii() else len(p.encode("utf-8", "surrogatepass")) for p in parts)
    cum = list(itertools.accumulate(sizes, initial=0))
    if runs is None:
        runs = _train_runs(train)
    return [(cum[i], cum[j]) for i, j in runs if cum[i] != cum[j]], cum[-1]


def _benchmark(n: int = 2000, name: str = "qwen2.5", repeats: int = 5) -> dict:
    """Rows/s of :meth:`ChatEncoder.encode_row` vs raw tiktoken on the same rendered text (one core)."""
    import tempfile
    import time

    import tiktoken

    from .testing import cached_tokenizer_dir, make_sharegpt

    with tempfile.TemporaryDirectory() as tmp:
        path = make_sharegpt(os.path.join(tmp, "rows.jsonl"), n, seed=11)
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
    enc = ChatEncoder.from_tokenizer(cached_tokenizer_dir(name), sample_rows=rows[:64])
    texts = [enc.template.render(to_messages(r, enc.style, enc.column)) for r in rows]
    pattern, ranks, added, _ = _tiktoken_spec(pathlib.Path(enc.path))
    raw = tiktoken.Encoding("raw", pat_str=pattern, mergeable_ranks=ranks, special_tokens=added)

    def run_raw():
        for s in texts:
            raw.encode(s, allowed_special="all")

    def run_rows():
        for r in rows:
            enc.encode_row(r)

    best = {"tiktoken": float("inf"), "encode_row": float("inf")}
    run_rows()  # warm the layouts and the prefix cache
    for _ in range(repeats):  # interleaved, best CPU time of each: the machine is shared
        for key, fn in (("tiktoken", run_raw), ("encode_row", run_rows)):
            t = time.process_time()
            fn()
            best[key] = min(best[key], time.process_time() - t)
    out = {k: n / v for k, v in best.items()}
    out["ratio"] = out["encode_row"] / out["tiktoken"]
    out["backend"] = enc.backend
    return out


if __name__ == "__main__":  # python -m vecpack.encoder [rows] [qwen2.5|llama3]
    import sys

    r = _benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 2000, *(sys.argv[2:3] or ["qwen2.5"]))
    print(f"raw tiktoken {r['tiktoken']:,.0f} rows/s | encode_row {r['encode_row']:,.0f} rows/s "
          f"({r['backend']}) | ratio {r['ratio']:.2f}")
