"""numba kernels that plan packs. No Python glue here: see plan.py; the packs are laid out by
:mod:`vecpack.packing._fill_kernels`.

Every kernel is ``@njit(cache=CACHE, nogil=True)`` (the interpreter lock is released while it runs: a plan made
in a thread lets the calling thread go on) and works on flat arrays only: lengths and indices are ``int64``, tokens and
labels ``int32`` (labels may be a bit mask: :func:`vecpack.packing._fill_kernels._label`). The glue passes inputs
as read-only views (see :func:`vecpack.packing.plan._ro`) so that each kernel is compiled once, whether its inputs
are in-memory or memory-mapped.

Pipeline (lengths -> Plan)::

    lengths --expand_entries--> entries (doc, start, length), all in 1..max_len
            --assign_greedy--> pack_offsets                         (input order)
            --assign_ffd / assign_bfd--> placement order + pack of each entry
            --shuffle_ranks + group_entries--> doc_index/doc_start/doc_length, pack_offsets

and the plans' checks (:func:`check_plan`, :func:`check_pair_plan`), torchtune's ``split_across_pack`` cut
(:func:`split_entries`), and the count of trained tokens (:func:`trained_tokens`).

Complexity: expand O(D); greedy O(E); ffd O(E log P); bfd O(E log max_len) (a counting sort by length, then a segment
tree over *remaining capacity* whose leaves are capacities 0..max_len; each leaf holds a stack of the packs with that
capacity, so best fit is "smallest non-empty leaf >= length").
"""

import numpy as np
from numba import njit, types

from vecpack._state import compile_once, kernel_cache
from vecpack.packing._fill_kernels import _trained, fill_pack, fill_packs  # noqa: F401 - LATER names these two

CACHE = kernel_cache()  # False where numba cannot write its cache (then compiled per process)

__all__ = ["LONG_DROP", "LONG_ERROR", "LONG_SPLIT", "LONG_TRUNCATE", "assign_bfd", "assign_ffd", "assign_greedy",
           "check_pair_plan", "check_plan", "expand_entries", "group_entries", "shuffle_ranks", "split_entries",
           "trained_tokens"]

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
#: The fill kernels (:mod:`vecpack.packing._fill_kernels`, with packed.py's types), compiled after
#: FIRST_RUN's second half, unwaited for.
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


@njit(cache=CACHE, inline='always')
def _full(n, value):
    """``np.full(n, value, np.int64)`` on ``np.empty`` alone: numba compiles each NumPy constructor
    a process uses once (``np.zeros``, ``np.full``, ``np.arange``: each its own compilation), so the
    kernels here use one. ``value`` is an ``np.int64`` (a literal would compile its own copy)."""
    out = np.empty(n, np.int64)
    for i in range(n):
        out[i] = value
    return out


@njit(cache=CACHE, nogil=True)
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


@njit(cache=CACHE, nogil=True)
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


@njit(cache=CACHE, nogil=True)
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


@njit(cache=CACHE, nogil=True)
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


@njit(cache=CACHE, nogil=True)
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


@njit(cache=CACHE, nogil=True)
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


@njit(cache=CACHE, nogil=True)
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


@njit(cache=CACHE, nogil=True)
def check_pair_plan(doc_lengths, pair_index, pair_lens, pack_offsets, max_len, shared):
    """Check a pair plan against a corpus of ``3 * pairs`` documents. Returns ``(code, where)``; 0 is OK.

    1: pack_offsets does not start at 0, decrease or end at len(pair_index)
    (where = pack); 2: pair_index out of range (entry); 3: a kept prompt is not
    the whole prompt, or a kept answer is negative or longer than its document
    (entry); 4: a pack holds more than max_len tokens (pack).
    """
    num_pairs = doc_lengths.shape[0] // 3
    n = pair_index.shape[0]
    num_packs = pack_offsets.shape[0] - 1
    if num_packs < 0 or pack_offsets[0] != 0 or pack_offsets[num_packs] != n:
        return 1, 0
    for i in range(num_packs):
        a = pack_offsets[i]
        b = pack_offsets[i + 1]
        if b < a:
            return 1, i
        used = 0
        for e in range(a, b):
            j = pair_index[e]
            if j < 0 or j >= num_pairs:
                return 2, e
            p = pair_lens[e, 0]
            c = pair_lens[e, 1]
            r = pair_lens[e, 2]
            if p != doc_lengths[3 * j] or c < 0 or r < 0 or c > doc_lengths[3 * j + 1] \
                    or r > doc_lengths[3 * j + 2]:
                return 3, e
            used += p + c + r if shared else 2 * p + c + r
        if used > max_len:
            return 4, i
    return 0, 0


@njit(cache=CACHE, nogil=True)
def split_entries(lengths, max_len):
    """``split_across_pack=True``: the documents as one stream, cut every ``max_len`` tokens.

    A zero-length document is an entry of length 0 in the pack that is open
    when it comes: torchtune closes a full pack only when the next token
    arrives. Documents with no tokens at all give no pack.

    Returns ``(entry_doc, entry_start, entry_len, pack_offsets)``: entry
    ``e`` is ``entry_len[e]`` tokens of document ``entry_doc[e]`` from token
    ``entry_start[e]``; pack ``p`` holds entries
    ``pack_offsets[p]:pack_offsets[p + 1]``.
    """
    n = lengths.shape[0]
    bound = 0
    for d in range(n):
        bound += 1 + (lengths[d] + max_len - 1) // max_len  # a cut document starts mid-pack
    entry_doc = np.empty(bound, np.int64)
    entry_start = np.empty(bound, np.int64)
    entry_len = np.empty(bound, np.int64)
    cuts = np.empty(bound + 2, np.int64)
    cuts[0] = 0
    p = 0
    used = 0
    k = 0
    for d in range(n):
        length = lengths[d]
        if length == 0:
            entry_doc[k] = d
            entry_start[k] = 0
            entry_len[k] = 0
            k += 1
            continue
        start = 0
        while start < length:
            if used == max_len:  # the next token closes the full pack
                p += 1
                cuts[p] = k
                used = 0
            take = min(length - start, max_len - used)
            entry_doc[k] = d
            entry_start[k] = start
            entry_len[k] = take
            k += 1
            used += take
            start += take
    if used == 0:  # no token at all
        return entry_doc[:0], entry_start[:0], entry_len[:0], cuts[:1].copy()
    cuts[p + 1] = k
    return entry_doc[:k], entry_start[:k], entry_len[:k], cuts[:p + 2].copy()


@njit(cache=CACHE, nogil=True)
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
