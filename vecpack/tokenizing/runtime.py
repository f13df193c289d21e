"""The tokenizer engines of one process: built once per tokenizer file, never pickled.

:class:`Runtime` holds what encoding needs in a process: the tiktoken core
built from :func:`~vecpack.tokenizing.spec.tiktoken_spec` (or HF
``tokenizers``), the bytes per token id for labels, and a cache of tokenized
conversation prefixes. :func:`runtime` memoises one per tokenizer file and
backend; :func:`tiktoken_ids` is what a parity check's tiktoken side runs.
"""

from __future__ import annotations

import pathlib
import pickle
import re
import unicodedata

import numpy as np

from vecpack._state import Memo, memo
from vecpack.options import cache_root
from vecpack.tokenizing.spec import Unsupported, byte_lengths, hf_byte_table, stat_key, tiktoken_spec, write_memo

__all__ = ["Runtime", "hf_facts", "runtime", "tiktoken_ids"]

_PREFIX_CACHE_MAX = 1024        # cached conversation prefixes per process


def tiktoken_ids(path: str, texts) -> list[list[int]] | str:
    """The tiktoken engine's ids of each of ``texts``, or why there are none."""
    try:
        rt = runtime(path, "tiktoken")
    except Unsupported as e:
        return str(e)
    out = []
    for text in texts:
        try:
            out.append(rt.encode_tiktoken(text))
        except Exception as e:  # pragma: no cover - engine bug
            return f"tiktoken failed on a sample ({type(e).__name__}: {e})"
    return out


class Runtime:
    """Per-process state of an encoder: the engine, tables and caches (never pickled)."""

    def __init__(self, path: pathlib.Path, backend: str):
        self.tk = None
        self.core = None
        self.bytelen = None
        self.nfc = False
        self.prefix_cache = Memo("conversation prefixes", _PREFIX_CACHE_MAX)
        if backend != "tiktoken":
            tk = self.load_tokenizers(path)
            self.added = {t.content: i for i, t in tk.get_added_tokens_decoder().items()}
            self.special_re = None
            table = hf_byte_table(path) if hasattr(tk, "encode_batch_fast") else None
            if table is not None:  # ids only from HF; labels from byte spans
                self.bytelen, self.nfc = table
            return
        pattern, ranks, self.added, self.nfc = tiktoken_spec(path)
        self.special_re = (re.compile("|".join(map(re.escape, sorted(self.added, key=len, reverse=True))))
                           if self.added else None)
        self.bytelen = byte_lengths(ranks, self.added)
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


_RUNTIMES = memo("tokenizer engines", 4)


def runtime(path: str, backend: str) -> Runtime:
    p = pathlib.Path(path)
    st = (p / "tokenizer.json").stat()
    key = (str(p), backend, st.st_size, st.st_mtime_ns)
    rt = _RUNTIMES.get(key)
    if rt is None:
        rt = _RUNTIMES[key] = Runtime(p, backend)
    return rt



def hf_facts(path: pathlib.Path, variables: dict) -> dict:
    """What the encoder needs from HF ``tokenizers``, memoised on disk per tokenizer file.

    ``{"added": [added token contents], "ids": {token text: id or None},
    "affixes": (prefix ids, suffix ids)}`` where the affixes are what the
    post-processor adds around a text (``<|begin_of_text|>`` for Llama 3).
    Loading Qwen's 151k merges into HF ``tokenizers`` takes most of a second,
    so the facts are kept under ``$VECPACK_CACHE/encoder`` (keyed by the
    files' path, size and mtime); a new process then builds its encoder
    without loading HF ``tokenizers`` at all.
    """
    wanted = sorted(set(variables.values()))
    key = stat_key(path, "tokenizer.json", "tokenizer_config.json")
    memo = cache_root() / "encoder" / f"{key}.pkl"
    try:
        with open(memo, "rb") as f:
            facts = pickle.load(f)
        if all(t in facts["ids"] for t in wanted):
            return facts
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError):
        pass
    hf = runtime(str(path), "tokenizers").load_tokenizers(path)
    bare = hf.encode("x", add_special_tokens=False).ids
    full = hf.encode("x", add_special_tokens=True).ids
    cut = next((i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare), None)
    facts = {"added": added_tokens(hf), "ids": {t: hf.token_to_id(t) for t in wanted},
             "affixes": ((), ()) if cut is None else (tuple(full[:cut]), tuple(full[cut + len(bare):]))}
    write_memo(memo, facts)
    return facts



def added_tokens(tk) -> list[str]:
    return [t.content for t in tk.get_added_tokens_decoder().values()]
