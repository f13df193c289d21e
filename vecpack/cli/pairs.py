"""Preference pairs in the CLI's views: the ``stats`` text and plot numbers, one pack's pairs for ``inspect``.

Everything here reads a :class:`~vecpack.packing.pairs.PackedPairs` and
returns text or numbers; :mod:`vecpack.cli.report` draws the plot. A pack
of pairs, rendered without color (trained tokens wrapped in ``«…»``)::

    pack 0 of 12 · 2 pairs · 1,530/2,048 tokens (74.7%) · 412 trained
    ⟦pair 17 · prompt 35 tokens · chosen 6 · rejected 6⟧
    prompt   │ <|im_start|>system ... <|im_start|>assistant
    chosen   │ «It is blue.<|im_end|>»
    rejected │ «It is green.<|im_end|>»
    ...
    ⟦padding · 518 tokens⟧
"""

from __future__ import annotations

import numpy as np

from vecpack.cli.report import _DOC, _PAD, _RESET, TokenDecoder, _pct, decode_spans, plural

__all__ = ["pair_pack_stats", "pairs_text", "render_pair_pack"]


def _units(packed) -> tuple[np.ndarray, np.ndarray]:
    """``(every pair's full unit length, each pack's placed tokens)``, int64."""
    copies = 1 if packed.plan.prefix_sharing else 2
    lens = np.diff(np.asarray(packed.offsets, np.int64)).reshape(-1, 3)
    full = copies * lens[:, 0] + lens[:, 1] + lens[:, 2]
    kept = np.asarray(packed.plan.pair_lens, np.int64)
    placed = np.concatenate([[0], np.cumsum(copies * kept[:, 0] + kept[:, 1] + kept[:, 2])])
    po = np.asarray(packed.pack_offsets, np.int64)
    return full, placed[po[1:]] - placed[po[:-1]]


def pair_pack_stats(packed) -> dict:
    """The numbers :func:`vecpack.cli.report.plot_stats` draws, for pairs (a pair is the unit).

    ``doc_lengths`` are the pairs' lengths as units (``2 * prompt + chosen +
    rejected``, the prompt once with prefix sharing), before truncation.

    >>> from vecpack.packing.pairs import pack_pairs
    >>> s = pair_pack_stats(pack_pairs(np.arange(1, 9, dtype=np.int32), np.array([0, 3, 5, 8]), max_len=12))
    >>> s["doc_lengths"].tolist(), s["pack_fill"].round(3).tolist(), s["num_packs"]
    ([11], [0.917], 1)
    """
    full, pack_tokens = _units(packed)
    num_packs = len(pack_tokens)
    pack_fill = pack_tokens / float(packed.max_len) if num_packs else np.zeros(0)
    st = packed.stats
    return {"num_documents": int(full.shape[0]), "num_packs": num_packs, "max_len": int(packed.max_len),
            "num_tokens": int(pack_tokens.sum()), "source_tokens": int(full.sum()),
            "fill": float(pack_fill.mean()) if num_packs else 0.0,
            "fill_min": float(pack_fill.min()) if num_packs else 0.0,
            "doc_lengths": full, "pack_fill": pack_fill,
            "truncated": int(st.get("truncated", 0)), "dropped": int(st.get("dropped", 0)), "split": 0}


def pairs_text(packed, *, title: str | None = None) -> str:
    """The ``vecpack stats`` report of preference pairs (a :class:`~vecpack.packing.pairs.PackedPairs`).

    >>> from vecpack.packing.pairs import pack_pairs
    >>> print(pairs_text(pack_pairs(np.arange(1, 9, dtype=np.int32), np.array([0, 3, 5, 8]), max_len=12)))
    1 pair · 2 sequences · 11 tokens (the prompt once per sequence) → 1 pack of 12 · fill 91.7%
    long 'truncate': 0 pairs truncated (0 answer tokens cut) · 0 pairs dropped
    trained tokens 5 · prompt tokens 6 (each prompt twice; prefix sharing would save 27.3%)
    """
    s = packed.stats
    lens = np.diff(np.asarray(packed.offsets, np.int64)).reshape(-1, 3)
    placed = lens[np.asarray(packed.plan.pair_index)]
    lines = [title] if title else []
    lines.append(f"{plural(s['num_pairs'], 'pair')} · {plural(s['num_sequences'], 'sequence')} · "
                 f"{plural(s['input_tokens'], 'token')} (the prompt once per sequence) → "
                 f"{plural(s['num_packs'], 'pack')} of {s['max_len']:,} · fill {_pct(s['fill'])}")
    lines.append(f"long {s['long']!r}: {plural(s['truncated'], 'pair')} truncated "
                 f"({plural(s['truncated_tokens'], 'answer token')} cut) · {plural(s['dropped'], 'pair')} dropped")
    saved = int(placed[:, 0].sum())
    if s.get("prefix_sharing"):
        lines.append(f"trained tokens {s['trained_tokens']:,} · prefix sharing: each prompt stored once, "
                     f"{saved:,} tokens saved ({_pct(saved / max(s['num_tokens'] + saved, 1))})")
    else:
        lines.append(f"trained tokens {s['trained_tokens']:,} · prompt tokens {2 * saved:,} (each prompt "
                     f"twice; prefix sharing would save {_pct(saved / max(s['num_tokens'], 1))})")
    return "\n".join(lines)


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
