"""One pass of a :class:`~vecpack.streaming.dataset.StreamingPackedDataset` over its shard.

:class:`Run` reads batches (:mod:`~vecpack.inputs.readers`), has them
tokenized (:mod:`~vecpack.streaming.encoding`), applies the ``long`` policy,
feeds the online packer (:mod:`vecpack.packing.online`) and lays out each
emitted pack with the packing kernels, so a streamed pack has exactly the
layout of ``Packed[i]``. Preference pairs (``style="preference"``) are one
entry each, of ``2 * prompt + chosen + rejected`` tokens (``prompt + chosen +
rejected`` with prefix sharing), after the pair ``long`` policy of
:func:`vecpack.packing.pairs.pair_policy`; a pack of them is laid out by
:func:`vecpack.packing.pairs.lay_out_pack`, as ``PackedPairs[i]``. Its
state (:meth:`Run.state_dict`) is the read cursor, the position of every
buffered document and of the open pack's, the counters, the epoch and the
packer's ramp (:data:`vecpack.packing.online.RAMP`; a state without one,
saved before the ramp, resumes without it); a restore re-reads and
re-encodes those documents.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from vecpack.errors import InputError
from vecpack.inputs.readers import Layout, ShardReader, ShuffledShardReader
from vecpack.options import INT32_MAX
from vecpack.packing.online import RAMP, BufferPacker
from vecpack.packing.pairs import lay_out_pack, pair_policy
from vecpack.streaming.encoding import Encoding, documents

__all__ = ["STATE_VERSION", "STAT_KEYS", "Run", "lay_out", "rows_of", "with_fill"]

STATE_VERSION = 1
# columns of the entry table kept in the state (and, per slot, in memory)
_F, _POS, _LINE, _ROW, _START, _LEN, _SEQ, _DOCLEN = range(8)
_NCOL = 8
STAT_KEYS = ("num_rows", "num_documents", "num_entries", "num_packs", "num_tokens",
             "input_tokens", "empty", "rejected", "truncated", "truncated_tokens",
             "dropped", "dropped_tokens", "split", "split_chunks")


class _Untrusted(Exception):
    """The parity check failed before the pass's first pack (the pass starts again on HF)."""


def lay_out(tokens: np.ndarray, labels: np.ndarray, lengths: np.ndarray, doc_ids: np.ndarray, max_len: int,
            pad_id: int, ignore_index: int) -> dict:
    """One pack whose entries lie back to back in ``tokens`` (all ``lengths`` >= 1), as
    ``Packed[i]``: what the packing kernel ``fill_entries`` writes, in NumPy, so that a stream's
    first pack does not wait for numba's import and the kernel's load.

    >>> out = lay_out(np.array([5, 6, 7], np.int32), np.array([5, 6, 7], np.int32), np.array([2, 1]),
    ...               np.array([3, 9]), 5, 0, -100)
    >>> [out[k].tolist() for k in ("input_ids", "labels", "position_ids", "document_ids")]
    [[5, 6, 7, 0, 0], [-100, 6, -100, -100, -100], [0, 1, 0, 0, 1], [3, 3, 9, -1, -1]]
    """
    n = int(tokens.shape[0])
    starts = np.zeros(lengths.shape[0], np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    ids = np.full(max_len, pad_id, np.int32)
    ids[:n] = tokens
    lab = np.full(max_len, ignore_index, np.int32)
    lab[:n] = labels
    lab[starts] = ignore_index
    pos = np.empty(max_len, np.int32)
    pos[:n] = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)
    pos[n:] = np.arange(max_len - n, dtype=np.int32)
    doc = np.full(max_len, -1, np.int32)
    doc[:n] = np.repeat(doc_ids.astype(np.int32), lengths)
    return {"input_ids": ids, "labels": lab, "position_ids": pos, "document_ids": doc}


def _docs_from_state(d: dict, rows: np.ndarray) -> list:
    saved = np.asarray(d["rows"], np.int64)
    off = np.asarray(d["offsets"], np.int64)
    tokens = np.asarray(d["tokens"], np.int32)
    labels = np.asarray(d["labels"], np.int32)
    idx = np.searchsorted(saved, rows)
    if (idx >= len(saved)).any() or not np.array_equal(saved[np.minimum(idx, len(saved) - 1)], rows):
        raise ValueError("state is missing the tokens of buffered documents")
    if d.get("lens") is not None:  # preference pairs: each row's prompt, chosen, rejected lengths
        lens = np.asarray(d["lens"], np.int64).reshape(len(saved), -1)
        return [(tokens[off[j]:off[j + 1]], labels[off[j]:off[j + 1]], lens[j]) for j in idx]
    return [(tokens[off[j]:off[j + 1]], labels[off[j]:off[j + 1]]) for j in idx]


def rows_of(enc: Encoding, reader: ShardReader, cursor, anchor, per_row: int = 1) -> Iterator:
    """``(batch, k, doc or None, reason)`` for every row the reader yields from ``cursor``, encoded
    (``per_row``: documents a row becomes, see :func:`~vecpack.streaming.encoding.documents`)."""
    for batch, rows in enc.map(reader.batches(cursor, anchor)):
        docs, errors = documents(rows, len(batch.payloads), per_row)
        for k, doc in enumerate(docs):
            yield batch, k, doc, errors.get(k)


def with_fill(stats: dict, max_len: int, epoch: int) -> dict:
    p = stats["num_packs"]
    stats["fill"] = stats["num_tokens"] / (p * max_len) if p else 0.0
    stats["epoch"] = epoch
    return stats


class Run:
    """One pass over a shard: the packer, the token store and the read cursor."""

    def __init__(self, ds, shard: int, nshards: int, state: dict | None):
        self.ds = ds
        self.shard, self.nshards = shard, nshards
        self.max_len = ds.max_len
        self.pairs = getattr(ds, "pairs", False)   # preference pairs: three documents per row, one entry
        self.per_row = 3 if self.pairs else 1
        # a state resumes with the ramp it was saved with (none before the ramp existed)
        ramp = RAMP if state is None else int(state["config"].get("ramp", 0))
        self.packer = BufferPacker(ds.max_len, ds.buffer_size, ramp)
        cap = ds.buffer_size + 64
        self.meta = np.zeros((cap, _NCOL), np.int64)     # one row per entry slot
        self.used = np.zeros(cap, bool)
        self.docs: list = [None] * cap                   # slot -> (tokens, labels) of the whole doc
        self.free = list(range(cap - 1, -1, -1))
        self.open: list[int] = []                        # slots of the open pack, mirrored
        self.started = False
        self.finished = False
        self._trusted = False                            # the engine's check passed (first pack)
        self._encodings: list = []
        if state is None:
            self.epoch = ds.epoch
            self.cursor = np.zeros(4 if ds.seed is None else 2, np.int64)
            self.anchor = None
            self.stats = dict.fromkeys(STAT_KEYS, 0)
            self.start_state = None
        else:
            self.epoch = int(state["epoch"])
            self.cursor = np.asarray(state["cursor"], np.int64).copy()
            self.anchor = state.get("anchor")
            self.stats = {k: int(state["stats"][k]) for k in STAT_KEYS}
            self.finished = bool(state["finished"])
            self.start_state = state

    # ------------------------------------------------------------------ slots
    def _slot(self) -> int:
        if not self.free:
            cap = self.meta.shape[0]
            self.meta = np.concatenate([self.meta, np.zeros((cap, _NCOL), np.int64)])
            self.used = np.concatenate([self.used, np.zeros(cap, bool)])
            self.docs.extend([None] * cap)
            self.free = list(range(2 * cap - 1, cap - 1, -1))
        s = self.free.pop()
        self.used[s] = True
        return s

    def _release(self, s: int) -> None:
        self.used[s] = False
        self.docs[s] = None
        self.free.append(s)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        if not self.started and self.start_state is not None:
            return self.start_state
        used = np.flatnonzero(self.used)
        in_open = np.zeros(self.used.shape[0], bool)
        in_open[self.open] = True
        buf = used[~in_open[used]]
        buf = buf[np.argsort(self.meta[buf, _SEQ], kind="stable")]
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "shard": [self.shard, self.nshards],
            "config": dict(self.ds._config(), ramp=self.packer.ramp),
            "cursor": [int(c) for c in self.cursor],
            "buffer": torch.from_numpy(self.meta[buf].copy()),
            "open": torch.from_numpy(self.meta[self.open].copy()),
            "next_seq": int(self.packer.next_seq),
            "stats": dict(self.stats),
            "finished": self.finished,
            "anchor": self.anchor,
            "docs": self._doc_tokens(np.concatenate([buf, np.asarray(self.open, np.int64)]))
            if self.ds._stream is not None else None,
        }

    def _doc_tokens(self, slots: np.ndarray) -> dict:
        """The documents of ``slots`` (by global row) as tokens, for inputs that cannot be re-read."""
        rows, first = np.unique(self.meta[slots, _ROW], return_index=True)
        docs = [self.docs[int(slots[j])] for j in first]
        lengths = [d[0].shape[0] for d in docs]
        out = {"rows": torch.from_numpy(rows.astype(np.int64)),
               "offsets": torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)),
               "tokens": torch.from_numpy(np.concatenate([d[0] for d in docs] or [np.zeros(0, np.int32)])),
               "labels": torch.from_numpy(np.concatenate([d[1] for d in docs] or [np.zeros(0, np.int32)]))}
        if self.pairs:
            out["lens"] = torch.from_numpy(np.concatenate([d[2] for d in docs] or [np.zeros(0, np.int64)]))
        return out

    def stats_dict(self) -> dict:
        return with_fill(dict(self.stats), self.max_len, self.epoch)

    def _restore(self) -> None:
        st = self.start_state
        buf = np.asarray(st["buffer"], np.int64).reshape(-1, _NCOL)
        opn = np.asarray(st["open"], np.int64).reshape(-1, _NCOL)
        table = np.concatenate([buf, opn])
        if len(table):
            # re-read and re-encode each document once (split chunks share one)
            keys, first, inverse = np.unique(table[:, [_F, _POS]], axis=0, return_index=True,
                                             return_inverse=True)
            refs = table[first][:, [_F, _POS, _LINE, _ROW]]
            if st.get("docs") is not None:
                docs = _docs_from_state(st["docs"], refs[:, 3])
            else:
                docs = self._reencode(refs)
            for j, ref in enumerate(refs):
                rows = table[inverse.reshape(-1) == j]
                d = docs[j]
                if d is None or d[0].shape[0] != int(rows[0, _DOCLEN]):
                    got = "cannot be encoded" if d is None else f"has {d[0].shape[0]} tokens"
                    raise InputError(f"row changed since the state was saved: it {got}, the state "
                                     f"says {int(rows[0, _DOCLEN])} tokens", **self._where(ref))
            inverse = inverse.reshape(-1)
        slots = []
        for k, row in enumerate(table):
            s = self._slot()
            self.meta[s] = row
            self.docs[s] = docs[inverse[k]]
            slots.append(s)
        nb = len(buf)
        self.packer.restore([(s, int(self.meta[s, _LEN]), int(self.meta[s, _SEQ])) for s in slots[:nb]],
                            [(s, int(self.meta[s, _LEN])) for s in slots[nb:]],
                            int(st["next_seq"]))
        self.open = slots[nb:]

    # ------------------------------------------------------------------ the input
    def _open(self) -> None:
        """Make the reader and the encoding of the pass (``self._reader``, ``self._encodings``)."""
        ds = self.ds
        if ds.seed is None:
            reader = ShardReader(ds._srcs, self.shard, self.nshards, ds.batch_rows, ds._stream)
        else:
            if not ds._layout.fresh(ds._srcs):
                ds._layout = Layout(ds._srcs)
            reader = ShuffledShardReader(ds._srcs, ds._layout, self.shard, self.nshards, ds.batch_rows,
                                    ds.seed, self.epoch)
        self._reader = reader
        self._encodings = [Encoding(ds.encoder, ds._n_jobs(), reader.where, ds._engine_start())]

    def _rows(self) -> Iterator:
        """``(ref, doc or None, reason)`` per row from the cursor on; the cursor follows."""
        for batch, k, doc, reason in rows_of(self._encodings[0], self._reader, self.cursor, self.anchor,
                                             self.per_row):
            # the cursor moves before the row is admitted: nothing reaches the caller in between
            self.cursor = batch.cursors[k]
            self.anchor = batch.anchor
            yield batch.refs[k], doc, reason

    def _where(self, ref) -> dict:
        """Where a row is, as ``InputError`` keywords."""
        return self._reader.where(ref)

    def _reencode(self, refs: np.ndarray) -> list:
        """The documents at ``refs`` read and encoded again (a restore)."""
        docs = []
        for part in self._encodings[0].encode(self._reader.read_rows(refs), refs):
            docs.extend(documents(part, part.records, self.per_row)[0])
        return docs

    # ------------------------------------------------------------------ the pass
    def packs(self) -> Iterator[dict]:
        """The pass's packs. If the parity check of the engine that tokenized them fails before the
        first one is out, the pass starts again on HF tokenizers (nothing unchecked is yielded)."""
        try:
            yield from self._pass()
        except Exception as e:
            # an error on rows an unchecked engine encoded (an engine that is wrong may trip the
            # encoder's own checks) is the check's failure if the check says so; else it stands
            if not isinstance(e, _Untrusted) and (self._trusted or not self._untrusted()):
                raise
            self.__init__(self.ds, self.shard, self.nshards, self.start_state)
            yield from self._pass()

    def _untrusted(self) -> bool:
        """Whether the check of the engine that encoded this pass's rows failed (waits for it)."""
        start = self._encodings[0].engine_start if self._encodings else None
        return start is not None and bool(start.gate())

    def _trust(self) -> None:
        """Before a pack goes out: the engine that encoded its rows passed its parity check."""
        if not self._trusted:
            if self._untrusted():
                raise _Untrusted
            self._trusted = True

    def _pass(self) -> Iterator[dict]:
        ds = self.ds
        self.started = True
        self._trusted = False
        if self.finished:
            return
        if ds._stream is not None and torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("a datasets.IterableDataset input streams in the main process only "
                               "(num_workers=0): datasets would shard it per worker itself; rows are "
                               "tokenized ahead in vecpack's pool instead (n_jobs)")
        self._encodings = []
        rows = None
        try:
            self._open()
            if self.start_state is not None:
                self._restore()
            packer = self.packer

            def pump():
                # decide while the buffer is full; a yield can happen mid-way, so a
                # restored run continues here before it reads anything
                while packer.full:
                    pack = packer.step()
                    if pack is not None:
                        self._trust()
                        yield self._emit(pack)
                        for enc in self._encodings:
                            enc.start()   # the first pack is out: now warm up the pool
                    else:
                        self.open = packer.open_pack

            yield from pump()
            rows = self._rows()
            for ref, doc, reason in rows:
                if doc is None:
                    if ds.on_error == "raise":
                        raise InputError(reason, **self._where(ref))
                    self.stats["rejected"] += 1
                    self.stats["num_rows"] += 1
                else:
                    self._admit(ref, doc)
                yield from pump()
            for pack in packer.drain():
                self._trust()
                yield self._emit(pack)
            self.open = []
            self.finished = True
        finally:
            if rows is not None:
                rows.close()
            for enc in self._encodings:
                enc.close()

    def _admit(self, ref, doc) -> None:
        """Long policy + buffer: one row becomes 0, 1 or several entries."""
        if self.pairs:
            return self._admit_pair(ref, doc)
        st = self.stats
        st["num_rows"] += 1
        tokens = doc[0]
        n = tokens.shape[0]
        st["input_tokens"] += n
        M = self.max_len
        if n == 0:
            st["empty"] += 1
            return
        if n <= M:
            chunks = [(0, n)]
        elif self.ds.long == "truncate":
            st["truncated"] += 1
            st["truncated_tokens"] += n - M
            chunks = [(0, M)]
        elif self.ds.long == "drop":
            st["dropped"] += 1
            st["dropped_tokens"] += n
            return
        elif self.ds.long == "split":
            st["split"] += 1
            chunks = [(a, min(M, n - a)) for a in range(0, n, M)]
            st["split_chunks"] += len(chunks)
        else:
            raise InputError(f"document is {n} tokens, longer than max_len={M}; pass "
                             "long='truncate', 'split' or 'drop', or raise max_len",
                             **self._where(ref))
        if ref[3] > INT32_MAX:
            raise InputError(f"row number {int(ref[3])} does not fit int32 document_ids",
                             **self._where(ref))
        st["num_documents"] += 1
        for start, length in chunks:
            self._buffer(ref, doc, start, length, n)

    def _buffer(self, ref, doc, start: int, length: int, n: int) -> None:
        """One entry of ``length`` tokens (from ``start`` of a row of ``n``) into a slot and the packer."""
        s = self._slot()
        m = self.meta[s]
        m[_F], m[_POS], m[_LINE], m[_ROW] = ref[0], ref[1], ref[2], ref[3]
        m[_START], m[_LEN], m[_DOCLEN] = start, length, n
        self.docs[s] = doc
        m[_SEQ] = self.packer.add(s, length)

    def _admit_pair(self, ref, doc) -> None:
        """A preference pair: one entry, after the pair ``long`` policy (never split from its partner)."""

        st = self.stats
        st["num_rows"] += 1
        p, c, r = (int(x) for x in doc[2])
        copies = 1 if self.ds.prefix_sharing else 2
        full = copies * p + c + r
        st["input_tokens"] += full
        if full == 0:
            st["empty"] += 1
            return
        M = self.max_len
        keep_c, keep_r, too_long, dropped = (int(a[0]) for a in pair_policy(doc[2], M, self.ds.long,
                                                                              self.ds.prefix_sharing))
        if too_long and self.ds.long == "error":
            raise InputError(f"preference pair needs {full} tokens (prompt {p}{' twice' if copies == 2 else ''}, "
                             f"chosen {c}, rejected {r}), more than max_len={M}; pass long='truncate' or "
                             "'drop', or raise max_len", **self._where(ref))
        if dropped:
            st["dropped"] += 1
            st["dropped_tokens"] += full
            return
        if too_long:
            st["truncated"] += 1
            st["truncated_tokens"] += c + r - keep_c - keep_r
        if ref[3] > INT32_MAX:
            raise InputError(f"row number {int(ref[3])} does not fit int32 document_ids", **self._where(ref))
        st["num_documents"] += 1
        self._buffer(ref, doc, 0, copies * p + keep_c + keep_r, p + c + r)

    def _emit(self, slots: list) -> dict:
        """The pack of ``slots`` (laid out by the packing kernels, as ``Packed[i]``); frees them."""
        if self.pairs:
            return self._emit_pairs(slots)
        M = self.max_len
        ds = self.ds
        lengths = np.empty(len(slots), np.int64)
        doc_ids = np.empty(len(slots), np.int64)
        toks, labs = [], []
        for j, s in enumerate(slots):
            m = self.meta[s]
            a, n = int(m[_START]), int(m[_LEN])
            t, lb = self.docs[s]
            toks.append(t[a:a + n])
            labs.append(lb[a:a + n])
            lengths[j], doc_ids[j] = n, m[_ROW]
            self._release(s)
        out = lay_out(np.concatenate(toks), np.concatenate(labs), lengths, doc_ids, M, ds.pad_id, ds.ignore_index)
        out["seq_lens"] = lengths.astype(np.int32)
        self.open = []
        st = self.stats
        st["num_packs"] += 1
        st["num_entries"] += len(slots)
        st["num_tokens"] += int(lengths.sum())
        return out

    def _emit_pairs(self, slots: list) -> dict:
        """The pack of the pairs in ``slots``, laid out as ``PackedPairs[i]``; frees them."""

        ds = self.ds
        docs = [self.docs[s] for s in slots]
        rows = self.meta[slots, _ROW].copy()
        used = int(self.meta[slots, _LEN].sum())
        for s in slots:
            self._release(s)
        out = lay_out_pack(np.concatenate([d[0] for d in docs]), np.concatenate([d[2] for d in docs]), rows,
                           self.max_len, long=ds.long, prefix_sharing=ds.prefix_sharing, pad_id=ds.pad_id,
                           ignore_index=ds.ignore_index)
        self.open = []
        st = self.stats
        st["num_packs"] += 1
        st["num_entries"] += len(slots)
        st["num_tokens"] += used
        return out
