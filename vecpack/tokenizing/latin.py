"""tiktoken's core on the tokens that Latin-script text can use; the whole table only when a text needs it.

Building tiktoken's core for Qwen2.5's 151,643 tokens holds the GIL all the
time it takes, and reading those ranks from their memo takes more. A stream serves its first packs with tiktoken
(:class:`vecpack.streaming.encoding.EngineStart`), so both are part of the
wait for its first pack.

BPE looks up only byte strings that lie inside the text it encodes: each
pre-token whole, then pairs of adjacent parts of it. So a table that lacks
some tokens gives a text the same ids as the whole table, as long as none of
the missing tokens occurs in that text's bytes.

Latin-script text here means characters of U+0000-U+03FF (ASCII, Latin-1,
Latin Extended, IPA, combining marks, Greek), U+2000-U+2FFF (punctuation such
as ``’`` and ``—``, currency, arrows, box drawing, other symbols) and
U+10000-U+3FFFF (emoji among them). In UTF-8 each such character is an ASCII
byte, or a lead byte ``C2``-``CF``, ``E2`` or ``F0`` followed by 1, 2 or 3
continuation bytes (``80``-``BF``)::

    "Você é ’"  ->  56 6f 63 | c3 aa | 20 | c3 a9 | 20 | e2 80 99
                               ^^ lead, then its continuation

A token that holds another lead byte, a continuation byte where none can
be, or a lead without its continuation bytes before another character
(:func:`latin_token` is False) never occurs in the bytes of such a text.
Qwen2.5 has 102,979 tokens that can; its core builds from them in about
two thirds of the time.

:class:`StartCore` builds a core when a text first needs one: the Latin-script
table for a Latin-script text (:func:`is_latin`), the whole table for any
other text. Once the whole table is built it serves every text. The ids are
the same either way (``tests/test_latin.py`` checks every token, and texts of
every character of these blocks and of their neighbours).

>>> latin_token(b" caf\\xc3\\xa9"), latin_token(b"\\xa9s"), latin_token(b"\\xe6\\x97\\xa5")
(True, True, False)
>>> is_latin("Você é — 👍"), is_latin("日本"), is_latin("Привет")
(True, False, False)
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from typing import Callable

__all__ = ["RANGES", "StartCore", "is_latin", "latin_ranks", "latin_token"]

#: The code points of Latin-script text (inclusive ranges, in order): what :func:`is_latin`
#: accepts, and what vecpack's own BPE (:mod:`vecpack.tokenizing.bpe`) encodes.
RANGES = ((0x0000, 0x03FF), (0x2000, 0x2FFF), (0x10000, 0x3FFFF))
#: The lead bytes of the characters :func:`is_latin` accepts, and the continuation bytes each takes.
LEADS = {**{b: 1 for b in range(0xC2, 0xD0)}, 0xE2: 2, 0xF0: 3}
_OTHER = re.compile("[^" + "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in RANGES) + "]")


def latin_token(token: bytes) -> bool:
    """Whether ``token`` can occur in the UTF-8 bytes of a Latin-script text (:func:`is_latin`).

    Its bytes are ASCII, lead bytes of :data:`LEADS` and continuation bytes
    ``80``-``BF``. A token may start inside a character (up to 3 continuation
    bytes) and end inside one (a lead with fewer continuation bytes than it
    takes); in between, each lead has all its continuation bytes and no other
    continuation byte occurs. (What follows a lead is not checked further: a
    token kept that no such text holds costs table space, never an id.)
    """
    n, i = len(token), 0
    while i < n and 0x80 <= token[i] <= 0xBF:
        i += 1
    if i > 3:
        return False
    while i < n:
        b = token[i]
        i += 1
        if b < 0x80:
            continue
        need = LEADS.get(b)
        if need is None:  # a continuation byte with no lead, or another lead
            return False
        for _ in range(need):
            if i == n:
                return True  # the token ends inside this character
            if not 0x80 <= token[i] <= 0xBF:
                return False
            i += 1
    return True


def latin_ranks(ranks: dict[bytes, int]) -> dict[bytes, int]:
    """The part of ``ranks`` that Latin-script texts can use (:func:`latin_token`)."""
    return {token: rank for token, rank in ranks.items() if latin_token(token)}


def is_latin(text: str) -> bool:
    """Whether every character of ``text`` is in U+0000-U+03FF, U+2000-U+2FFF or U+10000-U+3FFFF."""
    return text.isascii() or _OTHER.search(text) is None


class StartCore:
    """tiktoken's ``CoreBPE`` on :func:`latin_ranks` while texts are Latin-script, on every token after.

    Args:
        latin: returns the Latin-script part of the ranks (called once, when a
            first Latin-script text comes before any other).
        full: returns the whole ranks (called once, when a text needs them).
        special: the added tokens (text -> id).
        pattern: the pre-tokenizer's regex.

    It answers what the runtime asks of tiktoken's core
    (:meth:`encode_to_tiktoken_buffer`, :meth:`encode`), the same ids from
    either table. Safe to call from several threads (a stream's parity check
    encodes in a thread of its own); each table's core is built once.

    A fork copies the lock as it is: held, if another thread was building a
    table at that moment (a driver's parity check encodes its probes in a
    thread while the driver forks its workers). The child then gets a lock of
    its own (:func:`os.register_at_fork`), and builds what it lacks itself.

    A process whose texts are Latin-script at first and then not builds both
    cores: the Latin-script table's read and core more than the whole table's
    alone, once.
    """

    def __init__(self, latin: Callable[[], dict[bytes, int]], full: Callable[[], dict[bytes, int]],
                 special: dict[str, int], pattern: str):
        self._ranks = {"latin": latin, "full": full}
        self._special, self._pattern = special, pattern
        self._lock = threading.Lock()
        self.latin = None  # the Latin-script table's core, while it serves
        self.full = None   # the whole table's core, once a text needed it
        _CORES.add(self)

    def _core_for(self, text: str):
        full = self.full
        if full is not None:
            return full
        latin = is_latin(text)
        core = self.latin if latin else None
        if core is not None:
            return core
        with self._lock:
            if self.full is None and (not latin or self.latin is None):
                which = "latin" if latin else "full"
                core = _core(self._ranks[which](), self._special, self._pattern)
                setattr(self, which, core)
                if not latin:
                    self.latin = None  # every text goes to the whole table now
            return self.full if self.full is not None else self.latin

    def encode_to_tiktoken_buffer(self, text: str, allowed_special):
        """tiktoken's ``encode_to_tiktoken_buffer``: the ids in a buffer of uint32."""
        return self._core_for(text).encode_to_tiktoken_buffer(text, allowed_special)

    def encode(self, text: str, allowed_special) -> list[int]:
        """tiktoken's ``encode``: the ids in a list."""
        return self._core_for(text).encode(text, allowed_special)


_CORES: "weakref.WeakSet[StartCore]" = weakref.WeakSet()  # this process's, for the fork handler


def _unlock_in_child() -> None:
    """After a fork, in the child: a new lock for every core (the parent's may have been held by a
    thread that does not exist here; a table it was building is built again when needed)."""
    for core in list(_CORES):
        core._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_unlock_in_child)


def _core(ranks: dict[bytes, int], special: dict[str, int], pattern: str):
    """tiktoken's core of these tables (what ``tiktoken.Encoding`` keeps as ``_core_bpe``)."""
    import tiktoken

    return tiktoken.Encoding("vecpack", pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)._core_bpe
