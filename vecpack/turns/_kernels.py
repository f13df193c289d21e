"""numba kernel that lays a conversation's per-turn documents out as one token trie. No glue here: see packed.py.

A conversation with trained assistant turns ``t_1 .. t_k`` is ``k`` documents
(document ``i`` renders the conversation up to ``t_i`` as its final turn).
Their token ids share prefixes; the trie keeps each shared token once, laid
out depth first::

    docs  d1 = a b c x        trie (DFS)   a  b  c  x  y  z      depth  0 1 2 3 3 4
          d2 = a b c y z                   0  1  2  3  4  5      end    6 6 6 4 6 6

Per stored token: ``src`` (its first occurrence in the corpus), ``depth``
(its position in its own documents), ``end`` (the exclusive end of its
subtree, from the unit's start: a query ``j`` may attend key ``i`` iff
``i <= j < end[i]``) and ``label`` (1 if any document trains it). A node's
child that starts a trained span is laid out right after it, so a model's
usual shifted loss (the logits at ``j - 1`` predict token ``j``) is exact;
two such children of one node cannot both be, and are reported.
"""

import numpy as np
from numba import njit

from vecpack._state import compile_once, kernel_cache

CACHE = kernel_cache()  # False where numba cannot write its cache (then compiled per process)

__all__ = ["build_tries"]


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


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
