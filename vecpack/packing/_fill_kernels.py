"""numba kernels that lay packs out, for every layout of :class:`vecpack.Packed`. No Python glue here: the
layouts are in :mod:`vecpack.packing.packed` (chat), :mod:`vecpack.packing.pairs`, :mod:`vecpack.packing.turns`,
torchtune's in :mod:`vecpack.torchtune.packed`, Megatron's files in :mod:`vecpack.integrations.export`
(:func:`fill_megatron`); the plans' kernels are in :mod:`vecpack.packing._kernels`.

Inputs are read-only views (:func:`vecpack.packing.plan._ro`): tokens and labels ``int32`` (labels may be a bit
mask: :func:`_label`), indices ``int64``; outputs are ``int32`` rows of ``max_len`` (torchtune's ``int64``).

Chat (a plan's entries, documents or chunks of them, back to back)::

    fill_packs (prange over packs) / fill_pack (one pack)
        -> input_ids, labels, position_ids, document_ids  [packs, max_len] int32
    fill_packs_part / fill_pack_part: the same over a corpus in parts (one call per part)
    fill_entries: one pack whose entries lie back to back (streaming, a cluster build's shards)

Preference pairs: a pair is three documents of the corpus (prompt, chosen, rejected: documents ``3j``,
``3j + 1``, ``3j + 2``) placed as one entry of ``2P + C + R`` kept tokens (``C``, ``R`` after truncation; the
prompt is never cut), as two sequences side by side, or of ``P + C + R`` with the prompt shared::

    separate (shared=False)                      shared (shared=True)
    | prompt | chosen | prompt | rejected |      | prompt | chosen | rejected |
    pos 0 .. P-1, P ..  0 .. P-1, P ..            0 .. P-1, P ..     P ..
    part  0     1       0      2                  0        1         2

Labels: ``ignore_index`` on prompts, the token on answers, ``ignore_index`` on the first token of every sequence
(a prompt's, or an answer's when the prompt is empty). ``document_ids`` hold the pair index (-1 on padding),
``part_ids`` 0 / 1 / 2 for prompt / chosen / rejected (-1 on padding); padding as chat's (positions from 0).

Per-turn tries (:func:`build_tries`): a conversation with trained assistant turns ``t_1 .. t_k`` is ``k``
documents (document ``i`` renders the conversation up to ``t_i`` as its final turn). Their token ids share
prefixes; the trie keeps each shared token once, laid out depth first::

    docs  d1 = a b c x        trie (DFS)   a  b  c  x  y  z      depth  0 1 2 3 3 4
          d2 = a b c y z                   0  1  2  3  4  5      end    6 6 6 4 6 6

Per stored token: ``src`` (its first occurrence in the corpus), ``depth`` (its position in its own documents),
``end`` (the exclusive end of its subtree, from the unit's start: a query ``j`` may attend key ``i`` iff
``i <= j < end[i]``) and ``label`` (1 if any document trains it). A node's child that starts a trained span is
laid out right after it, so a model's usual shifted loss (the logits at ``j - 1`` predict token ``j``) is exact;
two such children of one node cannot both be, and are reported.

torchtune (:func:`fill_torchtune_pack`): a pack as torchtune's ``PackedDataset`` writes it: labels copied as they
are, ``input_pos`` of token ``j`` of a document is ``j % max_len`` (a cut document keeps counting), padding
continues the last position, clamped to ``max_len - 1``, and is one more ``seq_lens`` entry::

    max_len 6, entries [3 tokens of doc 0][2 tokens of doc 1]
    tokens     a0 a1 a2 b0 b1 pad        seq_lens [3, 2, 1]
    input_pos   0  1  2  0  1  2         (the padding continues from 1)
"""

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from vecpack._state import compile_once, kernel_cache

CACHE = kernel_cache()  # False where numba cannot write its cache (then compiled per process)

__all__ = ["build_tries", "fill_entries", "fill_pack", "fill_pack_part", "fill_packs", "fill_packs_part",
           "fill_pair_pack", "fill_pair_packs", "fill_torchtune_pack", "fill_megatron"]


def _label(tokens, labels, i):
    """Token ``i``'s label: ``labels[i]``, or from a bit mask (uint8: bit ``i % 8`` of byte ``i // 8`` set: the token,
    clear: -100); ``_trained``: not ``ignore_index``. Run without the JIT; compiled kernels use the overloads."""
    return (tokens[i] if (labels[i >> 3] >> (i & 7)) & 1 else np.int32(-100)) if labels.dtype == np.uint8 else labels[i]


def _trained(labels, i, ignore_index):
    return (labels[i >> 3] >> (i & 7)) & 1 != 0 if labels.dtype == np.uint8 else labels[i] != ignore_index


@overload(_label, inline="always")
def _label_typed(tokens, labels, i):
    if labels.dtype == types.uint8:
        return lambda tokens, labels, i: tokens[i] if (labels[i >> 3] >> (i & 7)) & 1 else np.int32(-100)
    return lambda tokens, labels, i: labels[i]


@overload(_trained, inline="always")
def _trained_typed(labels, i, ignore_index):
    if labels.dtype == types.uint8:
        return lambda labels, i, ignore_index: (labels[i >> 3] >> (i & 7)) & 1 != 0
    return lambda labels, i, ignore_index: labels[i] != ignore_index


# -- chat ----------------------------------------------------------------------------------------------------

@njit(cache=CACHE)
def _write_entry(tokens, labels, src, n, d32, at, ignore_index, ids, lab, pos, doc):
    """Write one entry (``tokens[src:src + n]``, document ``d32``) at ``at`` of a pack row."""
    for j in range(n):
        ids[at + j] = tokens[src + j]
        lab[at + j] = _label(tokens, labels, src + j)
        pos[at + j] = j
        doc[at + j] = d32
    lab[at] = ignore_index


@njit(cache=CACHE)
def _pad_tail(at, pad_id, ignore_index, ids, lab, pos, doc):
    """Padding after the last entry: pad_id, ignore_index, positions from 0, document -1."""
    for j in range(ids.shape[0] - at):
        ids[at + j] = pad_id
        lab[at + j] = ignore_index
        pos[at + j] = j
        doc[at + j] = -1


@njit(cache=CACHE)
def _fill_row(tokens, labels, shift, offsets, doc_index, doc_start, doc_length, e0, e1,
              pad_id, ignore_index, ids, lab, pos, doc):
    """Write one pack (entries e0:e1) into four 1-D rows of max_len. ``tokens``/``labels`` hold the corpus
    tokens ``shift:shift + len(tokens)`` (the whole corpus when ``shift`` is 0); entries whose tokens lie
    elsewhere are skipped, their positions left for the call that holds them (a corpus in parts: the
    corpora of a mixture)."""
    at = 0
    hi = shift + tokens.shape[0]
    for e in range(e0, e1):
        d = doc_index[e]
        n = doc_length[e]
        src = offsets[d] + doc_start[e]
        if shift <= src < hi:
            _write_entry(tokens, labels, src - shift, n, np.int32(d), at, ignore_index,
                         ids, lab, pos, doc)
        at += n
    _pad_tail(at, pad_id, ignore_index, ids, lab, pos, doc)


@njit(cache=CACHE)
def fill_entries(tokens, labels, lengths, doc_ids, pad_id, ignore_index, ids, lab, pos, doc):
    """One pack whose entries lie back to back in ``tokens``: entry ``e`` has ``lengths[e]``
    tokens and document id ``doc_ids[e]`` (streaming assembles its packs this way)."""
    at = 0
    for e in range(lengths.shape[0]):
        n = lengths[e]
        _write_entry(tokens, labels, at, n, np.int32(doc_ids[e]), at, ignore_index, ids, lab, pos, doc)
        at += n
    _pad_tail(at, pad_id, ignore_index, ids, lab, pos, doc)


@njit(cache=CACHE)
def fill_pack(tokens, labels, offsets, doc_index, doc_start, doc_length, pack_offsets, p,
              pad_id, ignore_index, ids, lab, pos, doc):
    """Fill one pack ``p`` into four 1-D int32 arrays of max_len."""
    _fill_row(tokens, labels, 0, offsets, doc_index, doc_start, doc_length,
              pack_offsets[p], pack_offsets[p + 1], pad_id, ignore_index, ids, lab, pos, doc)


@njit(cache=CACHE, parallel=True)
def fill_packs(tokens, labels, offsets, doc_index, doc_start, doc_length, pack_offsets, start,
               pad_id, ignore_index, ids, lab, pos, doc):
    """Fill packs ``start:start + ids.shape[0]`` into [n, max_len] int32 arrays, in parallel
    (:func:`_fill_row` written out: a parallel loop that calls it takes far longer to compile)."""
    n, m = ids.shape
    for k in prange(n):
        p = start + k
        at = 0
        for e in range(pack_offsets[p], pack_offsets[p + 1]):
            d = doc_index[e]
            length = doc_length[e]
            src = np.uint64(offsets[d] + doc_start[e])  # unsigned: no negative-index test, a vector loop
            ua, d32 = np.uint64(at), np.int32(d)
            for j in range(np.uint64(length)):
                ids[k, ua + j] = tokens[src + j]
                lab[k, ua + j] = _label(tokens, labels, src + j)
                pos[k, ua + j] = j
                doc[k, ua + j] = d32
            lab[k, at] = ignore_index
            at += length
        ua = np.uint64(at)
        for j in range(np.uint64(m - at if at < m else 0)):
            ids[k, ua + j] = pad_id
            lab[k, ua + j] = ignore_index
            pos[k, ua + j] = j
            doc[k, ua + j] = -1


@njit(cache=CACHE)
def fill_pack_part(tokens, labels, shift, offsets, doc_index, doc_start, doc_length, pack_offsets, p,
                   pad_id, ignore_index, ids, lab, pos, doc):
    """:func:`fill_pack` for a corpus in parts: writes the entries whose tokens lie in ``tokens`` (corpus
    tokens ``shift:shift + len(tokens)``) and the padding; one call per part fills the pack."""
    _fill_row(tokens, labels, shift, offsets, doc_index, doc_start, doc_length,
              pack_offsets[p], pack_offsets[p + 1], pad_id, ignore_index, ids, lab, pos, doc)


@njit(cache=CACHE, parallel=True)
def fill_packs_part(tokens, labels, shift, offsets, doc_index, doc_start, doc_length, pack_offsets,
                    start, pad_id, ignore_index, ids, lab, pos, doc):
    """:func:`fill_packs` for one part of a corpus in parts (see :func:`fill_pack_part`)."""
    n, m = ids.shape
    hi = shift + tokens.shape[0]
    for k in prange(n):
        p = start + k
        at = 0
        for e in range(pack_offsets[p], pack_offsets[p + 1]):
            d = doc_index[e]
            length = doc_length[e]
            src = offsets[d] + doc_start[e]
            if shift <= src < hi:
                us, ua, d32 = np.uint64(src - shift), np.uint64(at), np.int32(d)  # as in fill_packs
                for j in range(np.uint64(length)):
                    ids[k, ua + j] = tokens[us + j]
                    lab[k, ua + j] = _label(tokens, labels, us + j)
                    pos[k, ua + j] = j
                    doc[k, ua + j] = d32
                lab[k, at] = ignore_index
            at += length
        ua = np.uint64(at)
        for j in range(np.uint64(m - at if at < m else 0)):
            ids[k, ua + j] = pad_id
            lab[k, ua + j] = ignore_index
            pos[k, ua + j] = j
            doc[k, ua + j] = -1


# -- preference pairs --------------------------------------------------------------------------------

@njit(cache=CACHE)
def _run(tokens, src, n, at, pos0, pair, kind, answer, ignore_index, ids, lab, pos, doc, part):
    """Write ``tokens[src:src + n]`` at ``at``: positions from ``pos0``, labels the tokens if ``answer``."""
    for k in range(n):
        ids[at + k] = tokens[src + k]
    if answer:
        for k in range(n):
            lab[at + k] = tokens[src + k]
    else:
        for k in range(n):
            lab[at + k] = ignore_index
    for k in range(n):
        pos[at + k] = pos0 + k
    for k in range(n):
        doc[at + k] = pair
    for k in range(n):
        part[at + k] = kind


@njit(cache=CACHE)
def _fill_pair_row(tokens, offsets, pair_index, pair_lens, e0, e1, shared, pad_id, ignore_index,
                   ids, lab, pos, doc, part):
    """Write the pairs ``e0:e1`` of a plan into one row of each array, then the padding."""
    at = 0
    for e in range(e0, e1):
        j = pair_index[e]
        p = pair_lens[e, 0]
        sp = offsets[3 * j]
        j32 = np.int32(j)
        if shared:
            c = pair_lens[e, 1]
            r = pair_lens[e, 2]
            _run(tokens, sp, p, at, 0, j32, 0, False, ignore_index, ids, lab, pos, doc, part)
            _run(tokens, offsets[3 * j + 1], c, at + p, p, j32, 1, True, ignore_index, ids, lab, pos, doc, part)
            _run(tokens, offsets[3 * j + 2], r, at + p + c, p, j32, 2, True, ignore_index, ids, lab, pos, doc,
                 part)
            if p > 0:
                lab[at] = ignore_index
            else:  # nothing predicts an answer's first token
                if c > 0:
                    lab[at] = ignore_index
                if r > 0:
                    lab[at + c] = ignore_index
            at += p + c + r
            continue
        for kind in (1, 2):
            src = offsets[3 * j + kind]
            n = pair_lens[e, kind]
            _run(tokens, sp, p, at, 0, j32, 0, False, ignore_index, ids, lab, pos, doc, part)
            _run(tokens, src, n, at + p, p, j32, kind, True, ignore_index, ids, lab, pos, doc, part)
            if p + n > 0:
                lab[at] = ignore_index
            at += p + n
    _pad_tail(at, pad_id, ignore_index, ids, lab, pos, doc)
    for k in range(at, ids.shape[0]):
        part[k] = -1


@njit(cache=CACHE)
def fill_pair_pack(tokens, offsets, pair_index, pair_lens, pack_offsets, i, shared, pad_id, ignore_index,
                   ids, lab, pos, doc, part):
    """Fill pack ``i`` into five 1-D int32 arrays of max_len."""
    _fill_pair_row(tokens, offsets, pair_index, pair_lens, pack_offsets[i], pack_offsets[i + 1], shared,
                   pad_id, ignore_index, ids, lab, pos, doc, part)


@njit(cache=CACHE, parallel=True)
def fill_pair_packs(tokens, offsets, pair_index, pair_lens, pack_offsets, start, shared, pad_id, ignore_index,
                    ids, lab, pos, doc, part):
    """Fill packs ``start:start + ids.shape[0]`` into [n, max_len] int32 arrays, in parallel."""
    for k in prange(ids.shape[0]):
        i = start + k
        _fill_pair_row(tokens, offsets, pair_index, pair_lens, pack_offsets[i], pack_offsets[i + 1], shared,
                       pad_id, ignore_index, ids[k], lab[k], pos[k], doc[k], part[k])


# -- per-turn tries --------------------------------------------------------------------------------

@njit(cache=CACHE)
def build_tries(tokens, trained, doc_offsets, conv_offsets, cap, src, depth, end, label, unit_offsets, kept):
    """Lay out every conversation's trie; returns ``(nodes written, bad conversation or -1)``.

    Args:
        tokens: int32, the corpus; ``trained``: uint8 per corpus token.
        doc_offsets: int64 ``[D + 1]``; ``conv_offsets``: int64 ``[C + 1]``, conversation ``c`` is
            documents ``conv_offsets[c]:conv_offsets[c + 1]``.
        cap: a conversation keeps its first documents while its trie holds at most ``cap``
            tokens (``-1``: all of them).
        src, depth, end, label: out, one entry per stored token (room for every corpus token).
        unit_offsets: out, int64 ``[C + 1]``; kept: out, int64 ``[C]`` documents kept.
    """
    n_conv = conv_offsets.shape[0] - 1
    room = 1
    for c in range(n_conv):
        w = doc_offsets[conv_offsets[c + 1]] - doc_offsets[conv_offsets[c]] + 1
        if w > room:
            room = w
    tok = np.empty(room, np.int32)
    first = np.empty(room, np.int64)
    last = np.empty(room, np.int64)
    nxt = np.empty(room, np.int64)
    par = np.empty(room, np.int64)
    orig = np.empty(room, np.int64)
    dep = np.empty(room, np.int64)
    size = np.empty(room, np.int64)
    pos = np.empty(room, np.int64)
    tr = np.zeros(room, np.uint8)
    out = 0
    unit_offsets[0] = 0
    for c in range(n_conv):
        n = 1
        first[0] = -1
        last[0] = -1
        dep[0] = -1
        ndocs = 0
        for d in range(conv_offsets[c], conv_offsets[c + 1]):
            n_before = n
            cur = 0
            for p in range(doc_offsets[d], doc_offsets[d + 1]):
                t = tokens[p]
                ch = first[cur]
                while ch != -1 and tok[ch] != t:
                    ch = nxt[ch]
                if ch == -1:
                    ch = n
                    n += 1
                    tok[ch] = t
                    orig[ch] = p
                    tr[ch] = 0
                    first[ch] = -1
                    last[ch] = -1
                    nxt[ch] = -1
                    par[ch] = cur
                    dep[ch] = dep[cur] + 1
                    if first[cur] == -1:
                        first[cur] = ch
                    else:
                        nxt[last[cur]] = ch
                    last[cur] = ch
                cur = ch
            if cap >= 0 and n - 1 > cap:  # this document does not fit: it and the later ones are left out
                for v in range(n_before, n):
                    q = par[v]
                    if q < n_before:  # unlink the new nodes hanging from older ones
                        prev = -1
                        ch = first[q]
                        while ch != v:
                            prev = ch
                            ch = nxt[ch]
                        if prev == -1:
                            first[q] = nxt[v]
                        else:
                            nxt[prev] = nxt[v]
                        if last[q] == v:
                            last[q] = prev
                n = n_before
                break
            ndocs += 1
        # the trained marks, walking the kept documents again
        for d in range(conv_offsets[c], conv_offsets[c] + ndocs):
            cur = 0
            for p in range(doc_offsets[d], doc_offsets[d + 1]):
                ch = first[cur]
                while tok[ch] != tokens[p]:
                    ch = nxt[ch]
                if trained[p]:
                    tr[ch] = 1
                cur = ch
        kept[c] = ndocs
        # a trained child goes first; a node with two is reported (its parent's logits cannot predict both)
        for v in range(1, n):
            ch = first[v]
            prev = -1
            seen = 0
            while ch != -1:
                following = nxt[ch]
                if tr[ch]:
                    seen += 1
                    if seen > 1:
                        return out, c
                    if prev != -1:  # move ch to the front
                        nxt[prev] = following
                        if last[v] == ch:
                            last[v] = prev
                        nxt[ch] = first[v]
                        first[v] = ch
                        ch = following
                        continue
                prev = ch
                ch = following
        for v in range(n):
            size[v] = 1
        for v in range(n - 1, 0, -1):  # a parent is made before its children
            size[par[v]] += size[v]
        pos[0] = -1
        for v in range(n):
            at = pos[v] + 1
            ch = first[v]
            while ch != -1:
                pos[ch] = at
                at += size[ch]
                ch = nxt[ch]
        for v in range(1, n):
            i = out + pos[v]
            src[i] = orig[v]
            depth[i] = dep[v]
            end[i] = pos[v] + size[v]
            label[i] = tr[v]
        for v in range(1, n):
            tr[v] = 0
        out += n - 1
        unit_offsets[c + 1] = out
    return out, -1


# -- torchtune --------------------------------------------------------------------------------

@njit(cache=CACHE)
def fill_torchtune_pack(tokens, labels, offsets, doc_index, doc_start, doc_length, e0, e1, max_len, pad_id,
              ignore_index, first_label, ids, lab, pos, seq):
    """Write the entries ``e0:e1`` as one torchtune pack.

    ``ids``, ``lab``, ``pos``: int64 [max_len]; ``seq``: int64 with room for
    ``e1 - e0 + 1`` values. With ``first_label`` the label of each document's
    first token is ``ignore_index``. Returns how many ``seq_lens`` were written.
    """
    at = 0
    ns = 0
    for e in range(e0, e1):
        d = doc_index[e]
        s = doc_start[e]
        n = doc_length[e]
        src = offsets[d] + s
        for j in range(n):
            ids[at + j] = tokens[src + j]
        for j in range(n):
            lab[at + j] = labels[src + j]
        for j in range(n):
            pos[at + j] = (s + j) % max_len
        if first_label and s == 0 and n > 0:
            lab[at] = ignore_index
        seq[ns] = n
        ns += 1
        at += n
    if at < max_len:
        last = pos[at - 1] if at > 0 else -1
        for j in range(at, max_len):
            ids[j] = pad_id
            lab[j] = ignore_index
            pos[j] = min(last + 1 + j - at, max_len - 1)
        seq[ns] = max_len - at
        ns += 1
    return ns


@njit(cache=CACHE, parallel=True, nogil=True)
def fill_megatron(tokens, labels, offsets, doc_index, doc_start, doc_length, pack_offsets, p0, num_packs,
                  out_start, stored, pad_id, ignore_index, ids, mask):
    """Write packs ``p0 .. p0 + num_packs - 1`` in Megatron's layout, in parallel over packs.

    Entry ``e`` (``i = e - pack_offsets[p0]``) is stored at ``ids[out_start[i]:out_start[i] + stored[i]]``:
    its ``n = doc_length[e]`` tokens, then ``pad_id``. ``mask[out_start[i] + j]`` is whether token
    ``j + 1`` of the entry carries a loss (label not ``ignore_index``, or its bit set), for ``j < n - 1``;
    False after.
    """
    e0 = pack_offsets[p0]
    pad = np.int32(pad_id)
    for k in prange(num_packs):
        p = p0 + k
        for e in range(pack_offsets[p], pack_offsets[p + 1]):
            i = e - e0
            # unsigned offsets: no negative-index test, so the copies vectorise (as the fill kernels do)
            o = np.uint64(out_start[i])
            n = np.uint64(doc_length[e])
            s = np.uint64(stored[i])
            src = np.uint64(offsets[doc_index[e]] + doc_start[e])
            for j in range(n):
                ids[o + j] = tokens[src + j]
            for j in range(n, s):
                ids[o + j] = pad
            last = n - np.uint64(1) if n > 0 else np.uint64(0)
            for j in range(last):
                mask[o + j] = _trained(labels, src + j + np.uint64(1), ignore_index)
            for j in range(last, s):
                mask[o + j] = False


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
