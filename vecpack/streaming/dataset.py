"""Streaming packing: pack while training runs, and resume exactly.

:class:`StreamingPackedDataset` is a torch ``IterableDataset`` that reads
rows, tokenizes them ahead of the packer (a process pool, or inline in each
DataLoader worker) and packs them with best fit over a bounded buffer
(:mod:`vecpack.packing.online`). Nothing is tokenized up front: the first
pack is out a few documents after the first 64 have been read (the packer's ramp,
:data:`vecpack.packing.online.RAMP`: the buffer then grows by one document
every two that arrive, to ``buffer_size``)::

    rows (JSONL / Parquet / datasets.Dataset), row r -> shard r % num_shards
      │   blocks of 64 rows (Parquet: row groups) in an order drawn from (seed, epoch),
      │   the rows of each block shuffled too; seed=None: file order
      │   read ahead in batches, tokenized by loky workers, consumed in order
      ▼
    buffer of <= buffer_size documents ──► best fit into the open pack
      │                                     (longest that fits, oldest first)
      ▼
    packs: {"input_ids", "labels", "position_ids", "document_ids": int32[max_len],
            "seq_lens": int32[S]}   -- exactly the layout of ``Packed[i]``

Shards: ``num_shards = world_size * num_workers`` (ranks times DataLoader
workers); shard ``rank * num_workers + worker_id`` owns the rows whose
global row number (0-based, over all files in order, blank lines not counted)
is congruent to it, so every row belongs to exactly one shard.
``document_ids`` is that global row number.

Resume: :meth:`~StreamingPackedDataset.state_dict` describes the live
iterator in a few kilobytes: the read cursor (file, byte offset, line, row),
the position of every buffered document and of the open pack's documents
(re-read and re-tokenized on restore, so no tokens are stored), the
counters and the epoch. :meth:`~StreamingPackedDataset.load_state_dict`
makes the next ``iter()`` continue exactly there; torchdata's
``StatefulDataLoader`` calls both for you, per worker. The stream after a
restore equals the uninterrupted one pack for pack. States hold only ints,
strings, lists and int64 ``torch`` tensors, so ``torch.save``/``torch.load``
(``weights_only=True``) and distributed checkpointing carry them.

Order: with ``seed`` (default 0) the input is cut into blocks of 64
consecutive rows (JSONL: found by a one-pass newline index, see
:func:`_jsonl_index`; Parquet: one block per row group); each pass visits
the blocks in a permutation drawn from ``(seed, epoch)`` and each block's
rows in a permutation of their own, so a file sorted by source or length
does not make correlated packs, and every epoch has its own order. The
order depends on the seed, the epoch and the inputs only (not ``n_jobs``,
not timing); the cursor is then ``(block in the epoch's order, row in the
block's order)``. ``seed=None`` reads in file order.

Epochs: one ``iter()`` is one pass over the shard's rows; at the end the
buffer is drained and the last, partial pack emitted. :meth:`set_epoch`
selects the pass (its order, with a seed) and labels it in stats and states.
Memory is bounded by the buffer (``buffer_size`` documents), the read-ahead
(``2 * n_jobs`` batches of ``batch_rows`` rows) and one open pack, whatever
the dataset size.

>>> import json, os, tempfile
>>> import numpy as np
>>> class Chars:                      # a toy encoder: one token per character
...     def encode_row(self, row):
...         t = np.array([ord(c) for c in row["text"]], np.int32)
...         return t, t
>>> path = os.path.join(tempfile.mkdtemp(), "rows.jsonl")
>>> with open(path, "w") as f:
...     for text in ["hello", "hi", "greetings", "yo"]:
...         _ = f.write(json.dumps({"text": text}) + "\\n")
>>> make = lambda seed: StreamingPackedDataset(path, max_len=8, buffer_size=2, encoder=Chars(),
...                                            n_jobs=1, seed=seed)
>>> ds = make(None)                   # file order
>>> it = iter(ds)
>>> next(it)["document_ids"].tolist()
[0, 0, 0, 0, 0, 1, 1, -1]
>>> state = ds.state_dict()           # after one pack; "greetings" (truncated) is buffered
>>> resumed = make(None)
>>> resumed.load_state_dict(state)
>>> [p["document_ids"].tolist() for p in resumed] == [p["document_ids"].tolist() for p in it]
True
>>> resumed.stats["num_packs"], resumed.stats["truncated"], round(resumed.stats["fill"], 3)
(3, 1, 0.708)
>>> shuffled = make(0)                # the default: a seeded order, new each epoch
>>> [p["document_ids"].tolist() for p in shuffled]
[[3, 3, 1, 1, -1, -1, -1, -1], [2, 2, 2, 2, 2, 2, 2, 2], [0, 0, 0, 0, 0, -1, -1, -1]]
"""

from __future__ import annotations

import os
from typing import Iterator

import torch
from torch.utils.data import IterableDataset

from vecpack import options
from vecpack.inputs.readers import Layout, default_shard, reader
from vecpack.inputs.sources import resolve_sources
from vecpack.options import STREAM_STRATEGIES, check_choice, check_int, check_seed
from vecpack.pipeline.request import make_request
from vecpack.streaming.encoding import EngineStart
from vecpack.streaming.mix import SOURCE_STATS, BalancedStream, MixRun, mixture_stats, stream_sources
from vecpack.streaming.run import STAT_KEYS, STATE_VERSION, Run, with_fill
from vecpack.tokenizing.corpus import encoder_class
from vecpack.tokenizing.encoder import encoder_for, remember
from vecpack.tokenizing.pool import effective_n_jobs
from vecpack.tokenizing.spec import default_pad_id

__all__ = ["StreamingPackedDataset"]


def _is_hf_iterable(obj) -> bool:
    return type(obj).__name__ == "IterableDataset" and (type(obj).__module__ or "").startswith("datasets")


def _head(hf, n: int):
    """The first ``n`` rows of an HF IterableDataset as a ``datasets.Dataset`` (encoder checks)."""
    import itertools

    import datasets

    initial = hf.state_dict()
    rows = list(itertools.islice(iter(hf), n))
    hf.load_state_dict(initial)
    return datasets.Dataset.from_list(rows) if rows else []


class StreamingPackedDataset(IterableDataset):
    """Pack chat data on the fly, with an exactly resumable iterator.

    Args:
        data_files: a JSONL or Parquet path, a glob, a list of them, a
            ``datasets.Dataset``, or a ``datasets.IterableDataset`` (read in
            the main process only; its state and the buffered tokens go into
            :meth:`state_dict`). JSON-array files cannot be streamed.
        tokenizer: a local Hugging Face tokenizer directory or a
            ``transformers`` tokenizer (a :class:`~vecpack.tokenizing.encoder.ChatEncoder`
            is built from it once per process); may be None with ``encoder``.
        max_len: tokens per pack.
        style, column, masking: how rows become messages and which tokens
            carry loss (see :mod:`vecpack.chat.formats`, :mod:`vecpack.tokenizing.encoder`).
            ``style="preference"`` streams preference pairs (docs/preference.md):
            a pair is one entry of ``2 * prompt + chosen + rejected`` tokens,
            never split from its partner, and each pack is what
            ``PackedPairs[i]`` holds (``part_ids``, ``seq_pairs``,
            ``seq_parts`` too; ``document_ids`` and ``seq_pairs`` are the
            global row number), ready for :func:`vecpack.collate_preference`.
        prefix_sharing: with ``style="preference"``, lay each pair out as
            ``prompt + chosen + rejected`` (see
            :func:`vecpack.packing.pairs.plan_pairs`).
        buffer_size: documents the packer chooses from (>= 1). 1 is greedy
            packing in input order (torchtune's); 1000 fills >= 0.99 on
            chat data. Above 64 the buffer ramps up: the packer starts
            deciding after 64 documents, and the buffer is ``buffer_size`` from
            ``2 * buffer_size`` documents on (docs/streaming.md).
        strategy: ``"bfd"`` (best fit over the buffer) or ``"greedy"``
            (same as ``buffer_size=1``).
        long: a document longer than ``max_len``: ``"truncate"`` keeps its
            first ``max_len`` tokens, ``"drop"`` leaves it out, ``"split"``
            cuts it into ``max_len`` chunks (each its own attention segment),
            ``"error"`` raises :class:`~vecpack.errors.InputError`. All are
            counted in :attr:`stats`. Pairs take ``"truncate"`` (both answers
            cut to one common cap, as ``vecpack.build`` does), ``"drop"`` or
            ``"error"``.
        pad_id: input_ids of padding; default: the encoder's ``pad_id``, else 0.
        ignore_index: labels of padding and of every entry's first token.
        on_error: a row that cannot be read or encoded: ``"raise"`` an
            :class:`~vecpack.errors.InputError` naming file and line, or
            ``"skip"`` it (counted as ``rejected``).
        n_jobs: tokenizing processes ahead of the packer (vecpack's shared
            loky pool); ``-1`` every core; default: every core in the main
            process, 1 (inline) inside a DataLoader worker.
        rank, world_size: this process's shard of the data; default:
            torch.distributed's when it is initialized (looked up at each
            ``iter()``), else 0 and 1.
        batch_rows: rows per tokenizing task.
        seed: the read order. An integer (default 0): blocks of 64 rows
            (Parquet: row groups) in an order drawn from ``(seed, epoch)``,
            rows within each block shuffled too; every epoch
            (:meth:`set_epoch`) has its own order, the same for any
            ``n_jobs``. ``None``: file order (required for a
            ``datasets.IterableDataset``, which cannot seek).
        encoder: any picklable object with ``encode_row(row) -> (int32
            tokens, int32 labels)``, used instead of ``tokenizer`` (e.g.
            :class:`vecpack.torchtune.encoder.TorchtuneEncoder`).

    Attributes:
        stats: counters of the current (or last) pass in this process:
            ``num_rows`` read, ``num_documents`` placed, ``num_entries``,
            ``num_packs``, ``num_tokens``, ``fill``, ``empty``, ``rejected``,
            ``truncated``/``truncated_tokens``, ``dropped``/``dropped_tokens``,
            ``split``/``split_chunks``, ``epoch``. For pairs, a document is
            a pair (``num_documents``: pairs placed), ``input_tokens`` counts
            ``2 * prompt + chosen + rejected`` (the prompt once with prefix
            sharing) and ``truncated_tokens`` the answer tokens cut. Inside DataLoader workers
            each worker's counters are in its state (see
            :meth:`stats_from_loader_state`).
    """

    def __init__(self, data_files, tokenizer=None, max_len: int | None = None, *, style: str = "sharegpt",
                 column: str | None = None, masking: str = "assistant", buffer_size: int = 1000,
                 strategy: str = "bfd", long: str = "truncate", pad_id: int | None = None,
                 ignore_index: int = -100, on_error: str = "raise", n_jobs: int | None = None,
                 rank: int | None = None, world_size: int | None = None, batch_rows: int = 64,
                 seed: int | None = 0, encoder=None, weights=None, mix_by: str = "tokens",
                 prefix_sharing: bool = False, chat_template_kwargs: dict | None = None,
                 train_reasoning: bool = True):
        super().__init__()
        request = make_request(data_files, tokenizer, {
            "max_len": max_len, "style": style, "column": column, "masking": masking, "strategy": strategy,
            "long": long, "pad_id": pad_id, "ignore_index": ignore_index, "on_error": on_error, "n_jobs": n_jobs,
            "encoder": encoder, "weights": weights, "mix_by": mix_by, "prefix_sharing": prefix_sharing,
            "chat_template_kwargs": chat_template_kwargs, "train_reasoning": train_reasoning},
            door="StreamingPackedDataset()", streaming=True)
        self.pairs = request.pairs
        if self.pairs and encoder is not None and not getattr(encoder, "pairs", False):
            raise ValueError(f"style='preference' needs a pair encoder (three documents per row: prompt, chosen, "
                             f"rejected), such as vecpack.tokenizing.pairs.PairEncoder; got "
                             f"{type(encoder).__name__}")
        self.prefix_sharing = request.pack.prefix_sharing
        check_choice(strategy, "strategy", STREAM_STRATEGIES,
                     hint="ffd needs every length up front: use vecpack.build")
        buffer_size = check_int(buffer_size, "buffer_size", minimum=1)
        batch_rows = check_int(batch_rows, "batch_rows", minimum=1)
        seed = check_seed(seed)
        self.data_files = data_files
        self._stream = None
        self._mix = None
        self.mix_by = request.mix.by if request.mixture else options.check_mix(mix_by)["mix_by"]
        files = list(request.inputs[0].files)
        if request.mixture:
            self._mix = stream_sources(request, seed=seed)
            self._srcs = [src for m in self._mix for src in m.srcs]
            encoder = self._mix[0].encoder
        elif files[0].kind == "iterable":
            if seed is not None:
                raise ValueError("a datasets.IterableDataset cannot be read in a seeded order (its rows "
                                 "have no positions to seek to): pass seed=None and shuffle it with "
                                 "its own .shuffle(seed=..., buffer_size=...) if needed")
            # no positions to re-read: buffered tokens travel in the state instead
            self._stream = (data_files, data_files.state_dict())
            self._srcs = files
            sample = resolve_sources(_head(data_files, 64))
        else:
            self._srcs = sample = files
            for s in self._srcs:
                if not reader(s.kind).streams:
                    raise reader(s.kind)._no_stream(s.name)
        self._key = None
        if encoder is None:
            cls = encoder_class(style)
            # a ChatEncoder's parity check runs beside the stream's start (EngineStart), not here
            chat = request.inputs[0].chat
            # (HF's process for the check starts now, unless this tokenizer was checked before)
            self._key, encoder = encoder_for(tokenizer, style, column, masking, sample,
                                             defer=cls is None, cls=cls, options=chat.encoder_options())
            self._tokenizer = tokenizer
        self.encoder = encoder
        self._start = None
        if self._key is not None and self._mix is None:
            self._engine_start()   # HF's side of the check and fastokens' build start now
        self.max_len = int(max_len)
        self.buffer_size = 1 if strategy == "greedy" else int(buffer_size)
        self.strategy = strategy
        self.long = long
        self.pad_id = int(default_pad_id(tokenizer, encoder) if pad_id is None else pad_id)
        self.ignore_index = int(ignore_index)
        self.on_error = on_error
        self.n_jobs = n_jobs
        if rank is not None or world_size is not None:
            default_shard(rank, world_size)            # validate now
        self.rank, self.world_size = rank, world_size   # None: torch.distributed's, at iter()
        self.batch_rows = batch_rows
        self.seed = None if seed is None else int(seed)
        # the shuffle units (JSONL: one newline scan, cached for big files), made here so that
        # DataLoader workers inherit them; remade at iter() if a file changed
        self._layout = None if seed is None or self._mix is not None else Layout(self._srcs)
        self.epoch = 0
        self._pending: dict | None = None   # a loaded state, for the next iter()
        self._run: Run | None = None       # the live iterator's state

    # pools, live iterators and engine starts do not travel to DataLoader workers
    def __getstate__(self):
        d = dict(self.__dict__)
        d["_run"] = None
        d["_start"] = None
        d.pop("_tokenizer", None)
        return d

    def _engine_start(self) -> EngineStart | None:
        """This process's :class:`~vecpack.streaming.encoding.EngineStart` of the encoder (made on first use,
        and again in a forked DataLoader worker)."""
        if self._mix is not None:
            return None
        start = self._start
        if start is None or start.pid != os.getpid():
            key, tokenizer = self._key, self.__dict__.get("_tokenizer")

            def fell_back(enc):
                self.encoder = enc
                if key is not None and tokenizer is not None:
                    remember(key, enc, tokenizer)

            start = self._start = EngineStart(self.encoder, fell_back)
        return start

    # ------------------------------------------------------------------ public
    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch``: its read order (with a seed), and its label in stats.

        A state given to :meth:`load_state_dict` carries its own epoch, which
        the resumed pass keeps. With DataLoader workers, call it before the
        loader creates its iterator (``persistent_workers=False``, the
        default): workers get a copy of the dataset at that moment.
        """
        self.epoch = int(epoch)

    def balanced(self, *, world_size: int | None = None, rank: int | None = None, micro_batches: int = 1,
                 window_steps: int = 8, cost: str = "attention", a: float | None = None,
                 seed: int | None = 0) -> BalancedStream:
        """This stream with its packs dealt to data-parallel ranks by attention cost, window by window
        (:class:`~vecpack.streaming.mix.BalancedStream`; every rank packs every row, and yields its
        share). Resumes exactly through its own ``state_dict``; docs/ranks.md."""
        return BalancedStream(self, world_size=world_size, rank=rank, micro_batches=micro_batches,
                              window_steps=window_steps, cost=cost, a=a, seed=seed)

    def __iter__(self) -> Iterator[dict]:
        shard, nshards = self._shard()
        state = self._pending
        if state is not None:
            self._check_state(state, shard, nshards)
        self._pending = None
        run = self._run_class()(self, shard, nshards, state)
        self._run = run
        return run.packs()

    def state_dict(self) -> dict:
        """Where the live iterator stands (or where the next ``iter()`` starts).

        Returns a small dict (ints, strings, lists, int64 tensors); give it to
        :meth:`load_state_dict` of a fresh dataset built with the same
        arguments to continue exactly there.
        """
        if self._pending is not None:
            return self._pending
        if self._run is not None:
            return self._run.state_dict()
        shard, nshards = self._shard()
        return self._run_class()(self, shard, nshards, None).state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` resume from ``state`` (see :meth:`state_dict`)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError("not a StreamingPackedDataset state (or from another vecpack version)")
        self._check_config(state)
        self._pending = state
        self._run = None

    @property
    def stats(self) -> dict:
        """Counters of the live (or last) pass in this process, with ``fill``."""
        if self._run is not None:
            return self._run.stats_dict()
        shard, nshards = self._shard()
        return self._run_class()(self, shard, nshards, None).stats_dict()

    @staticmethod
    def stats_from_loader_state(loader_state: dict) -> dict:
        """Sum the per-worker counters found in a ``StatefulDataLoader.state_dict()``."""
        found = []

        def walk(x):
            if isinstance(x, dict):
                if x.get("version") == STATE_VERSION and "stats" in x:
                    found.append(x)
                    return
                for v in x.values():
                    walk(v)

        walk(loader_state)
        if not found:
            raise ValueError("no StreamingPackedDataset state in this loader state")
        total = dict.fromkeys(STAT_KEYS, 0)
        for s in found:
            for k in STAT_KEYS:
                total[k] += int(s["stats"][k])
        out = with_fill(total, int(found[0]["config"]["max_len"]), int(found[0]["epoch"]))
        if found[0].get("mix") is not None:
            mix = found[0]["mix"]
            per = [{k: sum(int(s["mix"]["sources"][i][k]) for s in found) for k in SOURCE_STATS}
                   for i in range(len(mix["sources"]))]
            out = mixture_stats(out, mix["names"], mix["weights"], mix["mix_by"], per)
        return out

    # ------------------------------------------------------------------ internals
    def _shard(self) -> tuple[int, int]:
        rank, world = default_shard(self.rank, self.world_size)
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * nw + wid, world * nw

    def _run_class(self):
        return Run if self._mix is None else MixRun

    def _n_jobs(self) -> int:
        if self.n_jobs is None:
            return 1 if torch.utils.data.get_worker_info() is not None else effective_n_jobs(-1)
        return effective_n_jobs(self.n_jobs)

    def _config(self) -> dict:
        config = {"max_len": self.max_len, "buffer_size": self.buffer_size, "long": self.long,
                  "strategy": self.strategy, "seed": self.seed,
                  "sources": [[s.name, s.kind, int(s.size)] for s in self._srcs]}
        if self.pairs:  # only then, so that the states of chat streams stay as they were
            config["pairs"] = {"prefix_sharing": self.prefix_sharing}
        if self._mix is not None:
            config["mixture"] = [[m.name, len(m.srcs), m.weight] for m in self._mix] + [self.mix_by]
        return config

    def _check_config(self, state: dict) -> None:
        mine, theirs = self._config(), state.get("config", {})
        for k in mine:
            if mine[k] != theirs.get(k):
                raise ValueError(f"state was saved with {k}={theirs.get(k)!r}, but this dataset has "
                                 f"{k}={mine[k]!r}; a stream resumes only with the same inputs and "
                                 "packing arguments")

    def _check_state(self, state: dict, shard: int, nshards: int) -> None:
        if list(state["shard"]) != [shard, nshards]:
            raise ValueError(f"state belongs to shard {state['shard'][0]} of {state['shard'][1]} "
                             f"(rank x DataLoader worker), but this iterator is shard {shard} of "
                             f"{nshards}; resume with the same world size and num_workers")
