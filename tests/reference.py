"""A naive pure-Python packer: the specification the numba kernels are tested against.

Quadratic, list-based and obviously correct; only for small inputs.
"""

from __future__ import annotations


def entries(lengths, max_len, long):
    """Documents -> entries ``(doc, start, length)`` in input order, and the counts."""
    out = []
    stats = dict(empty=0, truncated=0, truncated_tokens=0, dropped=0, dropped_tokens=0,
                 split=0, split_chunks=0)
    for d, n in enumerate(lengths):
        n = int(n)
        if n == 0:
            stats["empty"] += 1
        elif n <= max_len:
            out.append((d, 0, n))
        elif long == "truncate":
            out.append((d, 0, max_len))
            stats["truncated"] += 1
            stats["truncated_tokens"] += n - max_len
        elif long == "drop":
            stats["dropped"] += 1
            stats["dropped_tokens"] += n
        elif long == "split":
            stats["split"] += 1
            for start in range(0, n, max_len):
                out.append((d, start, min(max_len, n - start)))
                stats["split_chunks"] += 1
        else:
            raise ValueError(f"document {d} too long")
    return out, stats


def greedy(sizes, max_len):
    """Next fit in input order (torchtune's rule). Returns packs as lists of item ids."""
    packs, cur, used = [], [], 0
    for i, n in enumerate(sizes):
        if cur and used + n > max_len:
            packs.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        packs.append(cur)
    return packs


def _decreasing(sizes):
    return sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))


def ffd(sizes, max_len):
    """First fit decreasing (ties by input order): the lowest-numbered pack that fits."""
    packs, loads = [], []
    for i in _decreasing(sizes):
        for p, load in enumerate(loads):
            if load + sizes[i] <= max_len:
                packs[p].append(i)
                loads[p] += sizes[i]
                break
        else:
            packs.append([i])
            loads.append(sizes[i])
    return packs


def bfd(sizes, max_len):
    """Best fit decreasing: the fullest pack that fits (ties: lowest-numbered)."""
    packs, loads = [], []
    for i in _decreasing(sizes):
        best = None
        for p, load in enumerate(loads):
            if load + sizes[i] <= max_len and (best is None or load > loads[best]):
                best = p
        if best is None:
            packs.append([i])
            loads.append(sizes[i])
        else:
            packs[best].append(i)
            loads[best] += sizes[i]
    return packs


def pack_rows(tokens, labels, offsets, packs, max_len, pad_id=0, ignore_index=-100):
    """Build every pack's rows from packs given as lists of ``(doc, start, length)``."""
    rows = []
    for pack in packs:
        ids, lab, pos, doc, seq = [], [], [], [], []
        for d, start, n in pack:
            a = int(offsets[d]) + start
            ids += [int(t) for t in tokens[a:a + n]]
            lab += [ignore_index] + [int(t) for t in labels[a + 1:a + n]]
            pos += list(range(n))
            doc += [d] * n
            seq.append(n)
        pad = max_len - len(ids)
        assert pad >= 0
        rows.append(dict(input_ids=ids + [pad_id] * pad, labels=lab + [ignore_index] * pad,
                         position_ids=pos + list(range(pad)), document_ids=doc + [-1] * pad,
                         seq_lens=seq))
    return rows


def reference_labels(tokens, bytelen, parts, train, masking_all=False, nfc=False):
    """Labels by the rule, one token at a time: trained iff one of its bytes is in a trainable part.

    ``tokens`` spell ``"".join(parts)`` (each part NFC-normalized when ``nfc``); ``bytelen[t]`` is
    how many bytes token ``t`` spells.
    """
    import unicodedata

    if masking_all:
        return [int(t) for t in tokens]
    trained_bytes = set()
    at = 0
    for part, t in zip(parts, train):
        n = len((unicodedata.normalize("NFC", part) if nfc else part).encode("utf-8"))
        if t:
            trained_bytes.update(range(at, at + n))
        at += n
    out, pos = [], 0
    for tok in tokens:
        n = int(bytelen[int(tok)])
        out.append(int(tok) if any(b in trained_bytes for b in range(pos, pos + n)) else -100)
        pos += n
    assert pos == at, "the tokens do not spell the parts"
    return out


def trained_tokens(labels, offsets, doc_index, doc_start, doc_length, ignore_index=-100):
    """Labels that carry a loss in the packs: every entry's, its first token excepted."""
    total = 0
    for d, s, n in zip(doc_index, doc_start, doc_length):
        a = int(offsets[d]) + int(s)
        total += sum(1 for x in labels[a + 1:a + int(n)] if x != ignore_index)
    return total
