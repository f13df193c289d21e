"""One pack as text: its tokens decoded, documents (or pairs) marked, trained tokens wrapped.

What ``vecpack inspect`` prints; it works the same in a notebook. A pack, rendered without color
(documents open with ``⟦doc N⟧``; the tokens that carry a loss are wrapped in ``«…»``)::

    pack 0 of 125 · 3 documents · 2,011/2,048 tokens (98.2%) · 1,093 trained
    ⟦doc 17 · 845 tokens⟧
    <|im_start|>user
    Qual é o prazo?<|im_end|>
    <|im_start|>assistant
    «O recurso inominado tem prazo de dez dias úteis.<|im_end|>»
    ⟦doc 4 · 1,166 tokens⟧
    ...
    ⟦padding · 37 tokens⟧

A pack of pairs (:func:`render_pair_pack`)::

    pack 0 of 12 · 2 pairs · 1,530/2,048 tokens (74.7%) · 412 trained
    ⟦pair 17 · prompt 35 tokens · chosen 6 · rejected 6⟧
    prompt   │ <|im_start|>system ... <|im_start|>assistant
    chosen   │ «It is blue.<|im_end|>»
    rejected │ «It is green.<|im_end|>»
    ...
    ⟦padding · 518 tokens⟧
"""

from __future__ import annotations

import json
import os
import pathlib
import re

import numpy as np

from vecpack.cli.report import _CONTEXT, _DOC, _PAD, _RESET, _TRAINED, _pct, plural, short_name, source_of
from vecpack.tokenizing.spec import bytes_to_unicode

__all__ = ["TokenDecoder", "agentic_marks", "decode_spans", "render_pack", "render_pair_pack"]


class TokenDecoder:
    """Token ids -> text, from a tokenizer directory, without transformers.

    Byte-level BPE tokenizers (``tokenizer.json`` with a ByteLevel decoder, or
    a tiktoken ``tokenizer.model``) decode each token to its exact bytes, so
    a run of tokens decodes the same as the whole sequence; other
    ``tokenizer.json`` models fall back to ``tokenizers``' decoder.

    >>> import tempfile, pathlib, base64
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "tokenizer.model").write_text(
    ...     "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\\n" for b in range(256)))
    >>> TokenDecoder(d).decode([104, 105])
    'hi'
    """

    def __init__(self, path: str | os.PathLike):
        path = pathlib.Path(path)
        self.path = path
        self._pieces: list[bytes | None] | None = None
        self._tk = None
        if (path / "tokenizer.json").is_file():
            self._load_tokenizer_json(path / "tokenizer.json")
        elif (path / "tokenizer.model").is_file():
            self._load_tiktoken(path / "tokenizer.model")
        else:
            raise FileNotFoundError(f"{path}: no tokenizer.json or tokenizer.model in this directory")

    def _load_tokenizer_json(self, file: pathlib.Path) -> None:
        from tokenizers import Tokenizer

        self._tk = Tokenizer.from_file(str(file))
        spec = json.loads(file.read_text(encoding="utf-8"))
        decoder = spec.get("decoder") or {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
        if "ByteLevel" not in kinds:
            return
        u2b = {u: b for b, u in bytes_to_unicode().items()}
        size = self._tk.get_vocab_size(with_added_tokens=True)
        pieces: list[bytes | None] = [None] * size
        for piece, idx in self._tk.get_vocab(with_added_tokens=False).items():
            try:
                pieces[idx] = bytes(u2b[c] for c in piece)
            except KeyError:
                pieces[idx] = piece.encode("utf-8")
        for tok in spec.get("added_tokens", []):
            if 0 <= tok["id"] < size:
                pieces[tok["id"]] = tok["content"].encode("utf-8")
        self._pieces = pieces

    def _load_tiktoken(self, file: pathlib.Path) -> None:
        import base64

        ranks = {}
        for line in file.read_bytes().splitlines():
            if line.strip():
                tok, rank = line.split()
                ranks[int(rank)] = base64.b64decode(tok)
        pieces: list[bytes | None] = [None] * (max(ranks) + 1 if ranks else 0)
        for rank, tok in ranks.items():
            pieces[rank] = tok
        config = file.parent / "tokenizer_config.json"
        if config.is_file():  # special tokens of a Llama 3-style directory
            for idx, tok in json.loads(config.read_text("utf-8")).get("added_tokens_decoder", {}).items():
                idx = int(idx)
                pieces.extend([None] * (idx + 1 - len(pieces)))
                pieces[idx] = tok["content"].encode("utf-8")
        self._pieces = pieces

    def decode(self, ids) -> str:
        """Decode ``ids`` to text (invalid UTF-8 becomes U+FFFD; unknown ids ``<|id|>``)."""
        ids = [int(i) for i in ids]
        if self._pieces is None:
            return self._tk.decode(ids, skip_special_tokens=False)
        n = len(self._pieces)
        out = bytearray()
        for i in ids:
            piece = self._pieces[i] if 0 <= i < n else None
            out += piece if piece is not None else f"<|{i}|>".encode()
        return out.decode("utf-8", errors="replace")


def _runs(mask: np.ndarray):
    """``(start, stop, value)`` for each run of equal values in a boolean array."""
    if not len(mask):
        return
    change = np.flatnonzero(mask[1:] != mask[:-1]) + 1
    bounds = np.concatenate([[0], change, [len(mask)]])
    for a, b in zip(bounds[:-1], bounds[1:]):
        yield int(a), int(b), bool(mask[a])


def decode_spans(ids, is_trained, decoder: TokenDecoder, *, color: bool = False) -> str:
    """``ids`` decoded, the trained runs in green (``color``) or wrapped in ``«…»``, the rest dimmed or plain."""
    out = []
    for a, b, t in _runs(np.asarray(is_trained, bool)):
        text = decoder.decode(ids[a:b])
        if color:
            out.append(f"{_TRAINED if t else _CONTEXT}{text}{_RESET}")
        else:
            out.append(f"«{text}»" if t else text)
    return "".join(out)


#: what marks a tool call (followed by its JSON object), a tool result and a reasoning trace in the text of the
#: common chat templates (Hermes / Qwen, Mistral, Llama 3.x); Llama 3.1's bare JSON calls carry no mark, and a
#: Mistral turn's parallel calls count once
_AGENTIC_MARKS = (("tool call", re.compile(r'(?:<tool_call>|\[TOOL_CALLS\]\[?|<\|python_tag\|>)\s*\{"name": "')),
                  ("tool result", re.compile(r"<tool_response>|\[TOOL_RESULTS\]|<\|start_header_id\|>ipython")),
                  ("reasoning", re.compile(r"<think>\s*[^<\s]")))


def agentic_marks(text: str) -> list[str]:
    """What a document holds of tool calls, tool results and (non-empty) reasoning traces, as counted
    from the marks the common templates write (``[]`` for a plain conversation).

    >>> agentic_marks('<think>hm</think><tool_call>{"name": "f"}</tool_call><tool_response>1</tool_response>')
    ['1 tool call', '1 tool result', '1 reasoning']
    """
    out = []
    for what, mark in _AGENTIC_MARKS:
        n = sum(1 for _ in mark.finditer(text))
        if n:
            out.append(plural(n, what))
    return out


def render_pack(packed, index: int, decoder: TokenDecoder, *, color: bool = False,
                row_ids=None) -> str:
    """Pack ``index`` decoded, with document boundaries and trained spans marked; a document's header
    counts its tool calls, tool results and reasoning traces (:func:`agentic_marks`).

    Args:
        packed: the packed dataset.
        index: which pack (negative counts from the end).
        decoder: turns token ids into text.
        color: ANSI colors (a terminal) instead of ``⟦doc N⟧`` / ``«…»`` markers.
        row_ids: optional int64 [D], the input row of each document, shown
            next to the document number where they differ (rows were
            rejected before it; in a mixture, the row in its source, which
            is named too).
    """
    num_packs = len(packed)
    if not num_packs:
        raise IndexError("the dataset has no packs")
    if not -num_packs <= index < num_packs:
        raise IndexError(f"--pack {index} is out of range: the dataset has {plural(num_packs, 'pack')} "
                         f"(0 to {num_packs - 1:,})")
    index %= num_packs
    item = packed[index]
    input_ids = np.asarray(item["input_ids"])
    labels = np.asarray(item["labels"])
    seq_lens = np.asarray(item["seq_lens"], dtype=np.int64)
    e0, e1 = int(packed.pack_offsets[index]), int(packed.pack_offsets[index + 1])
    plan = packed.plan
    doc_index = np.asarray(plan.doc_index[e0:e1])
    doc_start = np.asarray(plan.doc_start[e0:e1])
    doc_full = np.diff(np.asarray(packed.offsets, dtype=np.int64))
    used = int(seq_lens.sum())
    trained = int(np.count_nonzero(labels[:used] != packed.ignore_index))

    def style(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    out = [f"pack {index:,} of {num_packs:,} · {plural(len(seq_lens), 'document')} · "
           f"{used:,}/{packed.max_len:,} tokens ({_pct(used / packed.max_len)}) · {trained:,} trained"]
    pos = 0
    for k, length in enumerate(seq_lens):
        length = int(length)
        doc = int(doc_index[k])
        header = [f"doc {doc:,}"]
        src = source_of(packed.stats, doc)
        if src is not None:
            header.append(f"source {src + 1} ({short_name(packed.stats['mixture']['sources'][src]['name'])})")
        if row_ids is not None and int(row_ids[doc]) != doc:  # rows were rejected before it
            header.append(f"row {int(row_ids[doc]):,}")
        header.append(f"{length:,} tokens")
        start = int(doc_start[k])
        if start or length < doc_full[doc]:
            header.append(f"tokens {start:,}-{start + length - 1:,} of {int(doc_full[doc]):,}")
        ids = input_ids[pos:pos + length]
        header.extend(agentic_marks(decoder.decode(ids.tolist())))
        out.append(style("⟦" + " · ".join(header) + "⟧", _DOC) + "\n")
        out.append(decode_spans(ids, labels[pos:pos + length] != packed.ignore_index, decoder, color=color))
        if not out[-1].endswith("\n") and not out[-1].endswith("\n" + _RESET):
            out.append("\n")
        pos += length
    if pos < packed.max_len:
        out.append(style(f"⟦padding · {packed.max_len - pos:,} tokens⟧", _PAD) + "\n")
    head, body = out[0], "".join(out[1:])
    return head + "\n" + body.rstrip("\n")


def render_pair_pack(packed, index: int, decoder: TokenDecoder, *, color: bool = False, row_ids=None) -> str:
    """Pack ``index`` of a :class:`~vecpack.packing.pairs.PackedPairs`, pair by pair: the prompt,
    the chosen and the rejected answer decoded, trained tokens marked (``«…»``, or green with ``color``).

    Args:
        packed: the packs of pairs.
        index: which pack (negative counts from the end).
        decoder: turns token ids into text.
        color: ANSI colors (a terminal) instead of markers.
        row_ids: optional, the input row of each corpus document (three per
            pair), shown where it differs from the pair number.

    >>> import pathlib, tempfile, base64
    >>> from vecpack.packing.pairs import pack_pairs
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "tokenizer.model").write_text(
    ...     "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\\n" for b in range(256)))
    >>> pp = pack_pairs(np.frombuffer(b"Sky?bluegreen", np.uint8).astype(np.int32), np.array([0, 4, 8, 13]), 24)
    >>> print(render_pair_pack(pp, 0, TokenDecoder(d)))
    pack 0 of 1 · 1 pair · 17/24 tokens (70.8%) · 9 trained
    ⟦pair 0 · prompt 4 tokens · chosen 4 · rejected 5⟧
    prompt   │ Sky?
    chosen   │ «blue»
    rejected │ «green»
    ⟦padding · 7 tokens⟧
    """
    n = len(packed)
    if not n:
        raise IndexError("the dataset has no packs")
    if not -n <= index < n:
        raise IndexError(f"--pack {index} is out of range: the dataset has {plural(n, 'pack')} (0 to {n - 1:,})")
    index %= n
    item = packed[index]
    ids, labels = np.asarray(item["input_ids"]), np.asarray(item["labels"])
    trained = labels != packed.ignore_index
    shared = packed.plan.prefix_sharing
    e0, e1 = int(packed.pack_offsets[index]), int(packed.pack_offsets[index + 1])
    full = np.diff(np.asarray(packed.offsets, np.int64)).reshape(-1, 3)
    used = int(item["seq_lens"].sum())

    def box(text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if color else text

    out = [f"pack {index:,} of {n:,} · {plural(e1 - e0, 'pair')} · {used:,}/{packed.max_len:,} tokens "
           f"({_pct(used / packed.max_len)}) · {int(trained[:used].sum()):,} trained"]
    pos = 0
    for e in range(e0, e1):
        j = int(packed.plan.pair_index[e])
        p, c, r = (int(x) for x in packed.plan.pair_lens[e])
        header = [f"pair {j:,}"]
        if row_ids is not None and int(row_ids[3 * j]) != j:
            header.append(f"row {int(row_ids[3 * j]):,}")
        header.append(f"prompt {plural(p, 'token')}" + (" (stored once)" if shared else ""))
        for name, kept, whole in (("chosen", c, int(full[j, 1])), ("rejected", r, int(full[j, 2]))):
            header.append(f"{name} {kept:,}" + (f" of {whole:,} (cut)" if kept < whole else ""))
        out.append(box("⟦" + " · ".join(header) + "⟧", _DOC))
        spans = [("prompt", pos, p), ("chosen", pos + p, c)]
        spans.append(("rejected", pos + p + c, r) if shared else ("rejected", pos + 2 * p + c, r))
        for name, a, k in spans:
            out.append(f"{name:<8} │ " + decode_spans(ids[a:a + k], trained[a:a + k], decoder, color=color))
        pos += (p if shared else 2 * p) + c + r
    if pos < packed.max_len:
        out.append(box(f"⟦padding · {packed.max_len - pos:,} tokens⟧", _PAD))
    return "\n".join(out)
