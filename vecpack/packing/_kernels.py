"""numba kernels for packing. No Python glue here: see plan.py and packed.py.

Every kernel is ``@njit(cache=CACHE)`` and works on flat arrays only: lengths and indices are ``int64``, tokens and
labels ``int32`` (labels may be a bit mask: :func:`_label`). The glue passes inputs as read-only views (see
:func:`vecpack.packing.plan._ro`) so that each kernel is compiled once, whether its inputs are in-memory or
memory-mapped.

Pipeline (lengths -> Plan)::

    lengths --expand_entries--> entries (doc, start, length), all in 1..max_len
            --assign_greedy--> pack_offsets                         (input order)
            --assign_ffd / assign_bfd--> placement order + pack of each entry
            --shuffle_ranks + group_entries--> doc_index/doc_start/doc_length, pack_offsets

then (Plan + tokens -> arrays)::

    fill_packs (prange over packs) / fill_pack (one pack)
        -> input_ids, labels, position_ids, document_ids  [packs, max_len] int32
    fill_packs_part / fill_pack_part: the same over a corpus in parts (one call per part)

Complexity: expand O(D); greedy O(E); ffd O(E log P); bfd O(E log max_len) (a counting sort by length, then a segment
tree over *remaining capacity* whose leaves are capacities 0..max_len; each leaf holds a stack of the packs with that
capacity, so best fit is "smallest non-empty leaf >= length").
"""

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from vecpack._state import compile_once, kernel_cache

CACHE = kernel_cache()  # False where numba cannot write its cache (then compiled per process)

__all__ = ["LONG_DROP", "LONG_ERROR", "LONG_SPLIT", "LONG_TRUNCATE", "assign_bfd", "assign_ffd", "assign_greedy",
           "check_plan", "expand_entries", "fill_pack", "fill_pack_part", "fill_packs", "fill_packs_part",
           "group_entries", "shuffle_ranks", "trained_tokens"]

_RO64 = types.Array(types.int64, 1, "C", readonly=True)  # plan.py's _ro views
_RO32 = types.Array(types.int32, 1, "C", readonly=True)
_RO8 = types.Array(types.uint8, 1, "C", readonly=True)  # a corpus's labels as a bit mask
_I64 = types.int64

#: What a machine's first ``vecpack pack`` (default options) compiles, with the types the glue passes,
#: in two halves of about equal compile time: vecpack._state.start_warming compiles them side by side
#: on a cold numba cache (tests/test_first_run.py checks that a pack uses these types).
FIRST_RUN = (
    (("expand_entries", (_RO64, _I64, _I64)),
     ("assign_bfd", (_RO64, _I64))),
    (("shuffle_ranks", (_I64, types.uint64)),
     ("group_entries", (_RO64, _RO64, _RO64, _I64, _RO64, _RO64, _RO64, types.boolean, types.boolean)),
     ("check_plan", (_RO64, _RO64, _RO64, _RO64, _RO64, _I64)),
     ("trained_tokens", (_RO8, _RO64, _RO64, _RO64, _RO64, _I64))),
)
_ROW, _ROWS = types.Array(types.int32, 1, "C"), types.Array(types.int32, 2, "C")  # filled packs
#: The fill kernels (packed.py's types), compiled after FIRST_RUN's second half, unwaited for.
LATER = (("fill_packs", (_RO32, _RO8) + (_RO64,) * 5 + (_I64,) * 3 + (_ROWS,) * 4),
         ("fill_pack", (_RO32, _RO8) + (_RO64,) * 5 + (_I64,) * 3 + (_ROW,) * 4))

LONG_TRUNCATE, LONG_DROP, LONG_SPLIT, LONG_ERROR = 0, 1, 2, 3

# expand_entries statistics slots.
ST_EMPTY = 0          # zero-length documents (dropped)
ST_LONG = 1           # documents longer than max_len
ST_LONG_TOKENS = 2    # their total length
ST_LONG_EXCESS = 3    # tokens beyond max_len in them (what truncation cuts)
ST_ENTRIES = 4        # entries produced
ST_TOKENS = 5         # tokens placed
ST_INPUT_TOKENS = 6   # sum of all lengths
ST_SIZE = 7


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


@njit(cache=CACHE, inline='always')
def _full(n, value):
    """``np.full(n, value, np.int64)`` on ``np.empty`` alone: numba compiles each NumPy constructor
    a process uses once (``np.zeros``, ``np.full``, ``np.arange``: each its own compilation), so the
    kernels here use one. ``value`` is an ``np.int64`` (a literal would compile its own copy)."""
    out = np.empty(n, np.int64)
    for i in range(n):
        out[i] = value
    return out


@njit(cache=CACHE)
def expand_entries(lengths, max_len, policy):
    """Turn document lengths into entries of 1..max_len tokens.

    Zero-length documents are skipped. A document longer than ``max_len`` is
    cut to ``max_len`` (LONG_TRUNCATE), skipped (LONG_DROP or LONG_ERROR; the
    caller raises before for LONG_ERROR) or cut into consecutive chunks of
    ``max_len`` with a shorter last chunk (LONG_SPLIT).

    Returns ``(entry_doc, entry_start, entry_len, stats)``; ``stats`` is an
    int64 array indexed by the ``ST_*`` constants.
    """
    n = lengths.shape[0]
    stats = _full(np.int64(ST_SIZE), np.int64(0))
    bound = n  # one entry per document at most, unless split
    if policy == LONG_SPLIT:
        bound = 0
        for i in range(n):
            length = lengths[i]
            bound += 1 if length <= max_len else (length + max_len - 1) // max_len
    entry_doc = np.empty(bound, np.int64)
    entry_start = _full(bound, np.int64(0))
    entry_len = np.empty(bound, np.int64)
    k = 0
    tokens = 0
    for i in range(n):
        length = lengths[i]
        stats[ST_INPUT_TOKENS] += length
        if length == 0:
            stats[ST_EMPTY] += 1
        elif length <= max_len:
            entry_doc[k] = i
            entry_len[k] = length
            tokens += length
            k += 1
        else:
            stats[ST_LONG] += 1
            stats[ST_LONG_TOKENS] += length
            stats[ST_LONG_EXCESS] += length - max_len
            if policy == LONG_TRUNCATE:
                entry_doc[k] = i
                entry_len[k] = max_len
                tokens += max_len
                k += 1
            elif policy == LONG_SPLIT:
                start = 0
                while start < length:
                    chunk = length - start if length - start < max_len else max_len
                    entry_doc[k] = i
                    entry_start[k] = start
                    entry_len[k] = chunk
                    tokens += chunk
                    start += chunk
                    k += 1
    stats[ST_ENTRIES] = k
    stats[ST_TOKENS] = tokens
    return entry_doc[:k], entry_start[:k], entry_len[:k], stats


@njit(cache=CACHE)
def assign_greedy(entry_len, max_len):
    """Next-fit in input order; returns ``pack_offsets`` (int64, P+1).

    This is exactly torchtune's ``PackedDataset(split_across_pack=False)``:
    an entry that would overflow the current pack closes it and starts the
    next one; the last, partial pack is kept.
    """
    n = entry_len.shape[0]
    cuts = np.empty(n + 1, np.int64)
    num_packs = 0
    used = 0
    cuts[0] = 0
    for i in range(n):
        length = entry_len[i]
        if used + length > max_len and used > 0:
            num_packs += 1
            cuts[num_packs] = i
            used = 0
        used += length
    if n > 0:
        num_packs += 1
        cuts[num_packs] = n
    return cuts[: num_packs + 1].copy()


@njit(cache=CACHE, inline='always')
def _order_decreasing(entry_len, max_len):
    """Counting sort: entry ids by decreasing length, ties by increasing id.

    Returns ``(order, counts)``; ``counts[n]`` is the number of entries of
    length ``n``, so the sorted lengths are runs the callers walk without
    touching ``entry_len`` again (random reads are the cost here).
    """
    n = entry_len.shape[0]
    counts = _full(max_len + 1, np.int64(0))
    for i in range(n):
        counts[entry_len[i]] += 1
    starts = np.empty(max_len + 1, np.int64)
    pos = 0
    for length in range(max_len, -1, -1):
        starts[length] = pos
        pos += counts[length]
    order = np.empty(n, np.int64)
    for i in range(n):
        length = entry_len[i]
        order[starts[length]] = i
        starts[length] += 1
    return order, counts


@njit(cache=CACHE)
def assign_ffd(entry_len, max_len):
    """First-fit decreasing over all entries.

    A max-segment-tree over packs holds each pack's remaining capacity;
    packs not opened yet hold ``max_len``, so the leftmost leaf with capacity
    >= length is the first pack that fits, or the next new one. First fit
    leaves at most one pack at most half full, so ``2 * tokens // max_len + 2``
    leaves always suffice.

    Returns ``(order, pack_sorted, counts, num_packs)``: entries in placement
    order (decreasing length), the pack of ``order[k]`` at ``pack_sorted[k]``
    (packs numbered in opening order), ``counts[n]`` = entries of length n,
    and the number of packs.
    """
    n = entry_len.shape[0]
    order, counts = _order_decreasing(entry_len, max_len)
    pack_sorted = np.empty(n, np.int64)
    total = 0
    for length in range(1, max_len + 1):
        total += length * counts[length]
    bound = 2 * total // max_len + 2
    if bound > n:
        bound = n
    size = 1
    while size < bound:
        size *= 2
    tree = _full(2 * size, np.int64(max_len))
    num_packs = 0
    k = 0
    for length in range(max_len, 0, -1):
        for _ in range(counts[length]):
            if tree[1] < length:  # cannot happen: the bound above is a theorem
                raise RuntimeError("vecpack: first-fit ran out of packs")
            node = 1
            while node < size:
                node = 2 * node
                if tree[node] < length:
                    node += 1
            p = node - size
            pack_sorted[k] = p
            k += 1
            if p + 1 > num_packs:
                num_packs = p + 1
            tree[node] -= length
            node >>= 1
            while node >= 1:
                a = tree[2 * node]
                b = tree[2 * node + 1]
                m = a if a > b else b
                if tree[node] == m:
                    break
                tree[node] = m
                node >>= 1
    return order, pack_sorted, counts, num_packs


@njit(cache=CACHE, inline='always')
def _tree_set(tree, size, leaf, value):
    """Set a leaf of a count segment tree to 0/1 and fix the counts above."""
    node = leaf + size
    delta = value - tree[node]
    if delta == 0:
        return
    while node >= 1:
        tree[node] += delta
        node >>= 1


@njit(cache=CACHE, inline='always')
def _tree_next(tree, size, leaf):
    """Smallest leaf index >= ``leaf`` whose count is non-zero, or -1."""
    node = leaf + size
    if tree[node] > 0:
        return leaf
    # Climb until a right sibling subtree holds something.
    while node > 1:
        if node & 1 == 0 and tree[node + 1] > 0:
            node += 1
            while node < size:
                node = 2 * node
                if tree[node] == 0:
                    node += 1
            return node - size
        node >>= 1
    return -1


@njit(cache=CACHE)
def assign_bfd(entry_len, max_len):
    """Best-fit decreasing over all entries in O(E log max_len).

    Packs are kept in buckets by remaining capacity (1..max_len-1; full packs
    leave the structure). A count segment tree over the capacities finds the
    smallest non-empty capacity >= the entry's length, the best fit; the pack
    is popped from that bucket (LIFO, so the result is deterministic) and
    pushed onto the bucket of its new capacity. Packs with equal remaining
    capacity are interchangeable for every later decision, so the pack count
    and the multiset of pack loads equal those of textbook BFD whatever the
    tie-break.

    Returns ``(order, pack_sorted, num_packs)`` like :func:`assign_ffd`.
    """
    n = entry_len.shape[0]
    order, counts = _order_decreasing(entry_len, max_len)
    pack_sorted = np.empty(n, np.int64)
    size = 1
    while size < max_len + 1:
        size *= 2
    tree = _full(2 * size, np.int64(0))
    head = _full(max_len + 1, np.int64(-1))
    # Best fit never leaves two packs at most half full: packs <= 2 * tokens // max_len + 1.
    total = 0
    for length in range(1, max_len + 1):
        total += length * counts[length]
    bound = 2 * total // max_len + 2
    if bound > n:
        bound = n
    nxt = np.empty(bound if bound > 1 else 1, np.int64)
    num_packs = 0
    k = 0
    for length in range(max_len, 0, -1):
        for _ in range(counts[length]):
            c = _tree_next(tree, size, length)
            if c < 0:
                p = num_packs
                num_packs += 1
                cap = max_len - length
            else:
                p = head[c]
                head[c] = nxt[p]
                if head[c] < 0:
                    _tree_set(tree, size, c, np.int64(0))
                cap = c - length
            pack_sorted[k] = p
            k += 1
            if cap > 0:
                if head[cap] < 0:
                    _tree_set(tree, size, cap, np.int64(1))
                nxt[p] = head[cap]
                head[cap] = p
    return order, pack_sorted, counts, num_packs


@njit(cache=CACHE, inline='always')
def _splitmix64(state):
    # uint64 arithmetic wraps modulo 2**64, as splitmix64 wants.
    state = state + np.uint64(0x9E3779B97F4A7C15)
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@njit(cache=CACHE)
def shuffle_ranks(num_packs, seed):
    """A uniform random permutation of ``range(num_packs)`` from ``seed``.

    Fisher-Yates driven by splitmix64 with rejection sampling (no modulo
    bias), so the result depends on the seed alone, not on the numpy version.
    """
    ranks = np.empty(num_packs, np.int64)
    for i in range(num_packs):
        ranks[i] = i
    state = np.uint64(seed)
    for i in range(num_packs - 1, 0, -1):
        bound = np.uint64(i + 1)
        # Largest multiple of bound that fits in 2**64, minus one.
        limit = np.uint64(0xFFFFFFFFFFFFFFFF) - (np.uint64(0xFFFFFFFFFFFFFFFF) % bound + np.uint64(1)) % bound
        while True:
            state, r = _splitmix64(state)
            if r <= limit:
                break
        j = np.int64(r % bound)
        t = ranks[i]
        ranks[i] = ranks[j]
        ranks[j] = t
    return ranks


@njit(cache=CACHE)
def group_entries(order, pack_sorted, counts, num_packs, ranks, entry_doc, entry_start,
                  identity, split):
    """Lay entries out pack by pack.

    ``order[k]`` was placed in pack ``pack_sorted[k]`` and has the k-th
    largest length (``counts`` from the assignment); pack ``p`` goes to
    position ``ranks[p]``; inside a pack, entries keep placement order.
    ``identity`` says entry ``e`` is document ``e`` (no empty, dropped or
    split documents) and ``split`` that ``entry_start`` may be non-zero; both
    only skip random reads. Returns ``(doc_index, doc_start, doc_length,
    pack_offsets)``.
    """
    n = order.shape[0]
    fill = _full(num_packs, np.int64(0))
    for k in range(n):
        fill[pack_sorted[k]] += 1
    pack_offsets = np.empty(num_packs + 1, np.int64)
    pack_offsets[0] = 0
    # Entry counts by rank, then prefix sums; fill[p] becomes pack p's first slot.
    by_rank = np.empty(num_packs, np.int64)
    for p in range(num_packs):
        by_rank[ranks[p]] = fill[p]
    for r in range(num_packs):
        pack_offsets[r + 1] = pack_offsets[r] + by_rank[r]
    for p in range(num_packs):
        fill[p] = pack_offsets[ranks[p]]
    doc_index = np.empty(n, np.int64)
    doc_start = _full(n, np.int64(0))
    doc_length = np.empty(n, np.int64)
    k = 0
    for length in range(counts.shape[0] - 1, 0, -1):
        for _ in range(counts[length]):
            e = order[k]
            p = pack_sorted[k]
            k += 1
            j = fill[p]
            fill[p] = j + 1
            doc_index[j] = e if identity else entry_doc[e]
            doc_length[j] = length
            if split:
                doc_start[j] = entry_start[e]
    return doc_index, doc_start, doc_length, pack_offsets


@njit(cache=CACHE)
def check_plan(doc_lengths, doc_index, doc_start, doc_length, pack_offsets, max_len):
    """Check a plan against a corpus. Returns ``(code, where)``; code 0 is OK. 1: pack_offsets does not
    start at 0, decrease or end at len(doc_index) (where = pack); 2: doc_index out of range (entry); 3: entry
    length not in 1..max_len (entry); 4: entry runs past the end of its document (entry); 5: pack holds more
    than max_len tokens (pack)."""
    num_docs = doc_lengths.shape[0]
    num_entries = doc_index.shape[0]
    num_packs = pack_offsets.shape[0] - 1
    if num_packs < 0 or pack_offsets[0] != 0 or pack_offsets[num_packs] != num_entries:
        return 1, 0
    for p in range(num_packs):
        a = pack_offsets[p]
        b = pack_offsets[p + 1]
        if b < a:
            return 1, p
        used = 0
        for e in range(a, b):
            d = doc_index[e]
            if d < 0 or d >= num_docs:
                return 2, e
            length = doc_length[e]
            if length < 1 or length > max_len:
                return 3, e
            if doc_start[e] < 0 or doc_start[e] + length > doc_lengths[d]:
                return 4, e
            used += length
        if used > max_len:
            return 5, p
    return 0, 0


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


@njit(cache=CACHE)
def trained_tokens(labels, offsets, doc_index, doc_start, doc_length, ignore_index):
    """Tokens of the packs that carry a loss: each entry's labels other than ``ignore_index``, its first
    one excepted (a pack sets it to ``ignore_index``). One thread: a count over memory, which ``parallel=True``
    barely speeds up, for a longer compilation."""
    total = 0
    for e in range(doc_index.shape[0]):
        a = offsets[doc_index[e]] + doc_start[e]
        c = 0
        for j in range(a + 1, a + doc_length[e]):
            if _trained(labels, j, ignore_index):
                c += 1
        total += c
    return total


compile_once(globals())   # concurrent first runs compile each kernel once (vecpack/_state.py)
