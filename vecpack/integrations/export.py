"""Export a packed dataset for trainers that read padding-free packs: TRL and friends, and Megatron-Bridge.

One row per pack, without padding, with the columns TRL's padding-free
training reads (``trl.pack_dataset`` writes ``input_ids`` and
``seq_lengths``; ``DataCollatorForLanguageModeling(padding_free=True)`` reads
``input_ids``, ``labels`` and ``seq_lengths`` and rebuilds ``position_ids``
from ``seq_lengths``)::

    input_ids     list<int32>  the pack's real tokens (length = sum(seq_lengths))
    labels        list<int32>  unshifted, -100 where no loss (first token of each document too)
    position_ids  list<int32>  restart at 0 at every document
    seq_lengths   list<int32>  the length of each document in the pack

Packs of preference pairs (a :class:`~vecpack.packing.pairs.PackedPairs`)
get the same columns, ``seq_lengths`` being each pair's two sequences, plus
the pair columns :func:`vecpack.collate_preference` and a DPO loss read::

    document_ids     list<int32>  the corpus pair of each token
    part_ids         list<int32>  0 prompt, 1 chosen, 2 rejected
    completion_mask  list<bool>   the answer tokens that are scored (labels != -100)
    seq_pairs        list<int32>  per sequence: its corpus pair (the two of a pair are side by side)
    seq_parts        list<int32>  per sequence: 1 chosen, 2 rejected
    is_chosen        list<bool>   per sequence: seq_parts == 1

so ``collate_preference`` takes the exported rows as they are (prefix-shared
packs included: their ``position_ids`` tell it).

Formats: ``parquet`` (one file, a row group per block of packs), ``jsonl``
(one JSON object per line), ``megatron`` (Megatron-Bridge's packed ``.npy`` or
``.idx.parquet`` and its metadata JSON: :mod:`vecpack.integrations.export`) and
``hf`` (``datasets.Dataset.save_to_disk``;
``datasets.load_from_disk`` memory-maps it). TRL's ``SFTTrainer`` trains the
``hf`` output as it is with ``SFTConfig(padding_free=True, max_length=None,
dataset_kwargs={"skip_prepare_dataset": True})`` (docs/trainers.md);
:func:`vecpack.hf_dataset` gives the same rows without writing them.

>>> import numpy as np, tempfile, json, vecpack
>>> from vecpack.integrations.export import export
>>> packed = vecpack.pack(np.arange(1, 8, dtype=np.int32), np.array([0, 3, 5, 7]), max_len=4,
...                       strategy="greedy")
>>> path = export(packed, tempfile.mkdtemp() + "/p.jsonl", "jsonl")
>>> json.loads(open(path).readline())["seq_lengths"]
[3]

**Megatron.** Megatron-Bridge / NeMo packed fine-tuning files, written from vecpack's packs.

Megatron-Bridge's offline packing (``megatron/bridge/data/packing/``) writes
one row per pack, read back by ``GPTSFTPackedDataset`` (``packing/gpt_sft.py``,
the ``.npy``) or ``GPTSFTPackedParquetDataset`` (``packing/parquet.py``, the
``.idx.parquet``)::

    input_ids     the pack's documents back to back, each as stored: its tokens,
                  then padding (the tokenizer's EOS) up to pad_seq_to_mult
    loss_mask     per token, already rolled by one: loss_mask[j] says whether the
                  label of input j (token j + 1) carries a loss
    seq_start_id  where each document starts in input_ids

plus a metadata JSON (a list of dicts, one per packed file: ``max_samples_per_bin``,
``dataset_max_seqlen``, ``packing_factor``, ``packing_efficiency``,
``pack_size``, ``min_packed_seqlen``) that its collate reads with
``pad_cu_seqlens``.

Megatron's collate cuts each stored document ``s`` into inputs ``s[:-1]`` and
labels ``s[1:]``, so a vecpack document of ``L`` tokens is a Megatron sequence
of ``L - 1`` (its "runtime" length), padded to a multiple of
``pad_seq_to_mult``; a pack's runtime lengths must sum to at most ``pack_size``
(vecpack's ``max_len``). A plan made with ``pad_to_multiple_of=m`` (rounding
``L`` up) always fits ``pad_seq_to_mult=m`` (rounding ``L - 1`` up); an unpadded
plan may not, and that is an error naming the pack. Labels match vecpack's:
input ``j`` of a document predicts token ``j + 1`` and carries a loss where
vecpack's label of token ``j + 1`` is not ``ignore_index``.

The ``.npy`` is what ``np.save`` writes for Megatron's list of dicts (an object
array, read through Megatron-Bridge's restricted unpickler), except that
``input_ids`` (int32) and ``loss_mask`` (bool) are numpy arrays rather than
lists of Python ints: the reader slices and concatenates them with numpy
either way, and the restricted unpickler allows arrays. ``seq_start_id`` is a
list (the reader appends to it). The parquet has the columns its reader
documents: ``input_ids`` ``list<int32>``, ``loss_mask`` ``list<int8>``,
``seq_start_id`` ``list<int32>``.

>>> import numpy as np, tempfile, vecpack
>>> packed = vecpack.pack(np.arange(1, 8, dtype=np.int32), np.array([0, 3, 5, 7]), max_len=8, strategy="greedy")
>>> rows = [r for b in megatron_blocks(packed) for r in b.rows()]
>>> rows[0]["input_ids"].tolist(), rows[0]["loss_mask"].astype(int).tolist(), rows[0]["seq_start_id"]
([1, 2, 3, 4, 5, 6, 7], [1, 1, 0, 1, 0, 1, 0], [0, 3, 5])
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from vecpack.options import EXPORT_FORMATS, check_choice, check_int, check_pad_multiple
from vecpack.packing import _fill_kernels as _kernels
from vecpack.packing.plan import _ro

__all__ = ["COLUMNS", "FORMATS", "MegatronBlock", "PAIR_COLUMNS", "check_dest", "default_metadata_path", "export",
           "export_megatron", "iter_batches", "megatron_blocks", "megatron_metadata", "write_megatron",
           "write_metadata"]


COLUMNS = ("input_ids", "labels", "position_ids", "seq_lengths")
#: The extra columns of preference pairs: per token, then per sequence.
PAIR_COLUMNS = ("document_ids", "part_ids", "completion_mask", "seq_pairs", "seq_parts", "is_chosen")
FORMATS = EXPORT_FORMATS
_BOOL = ("completion_mask", "is_chosen")


def _is_pairs(packed) -> bool:
    return getattr(packed, "kind", None) == "pairs"  # a Packed of vecpack.packing.pairs's layout


def _layout(packed) -> tuple[tuple, tuple]:
    """``(per-token columns, per-sequence columns)`` of ``packed``'s rows."""
    if _is_pairs(packed):
        return COLUMNS[:3] + PAIR_COLUMNS[:3], (COLUMNS[3],) + PAIR_COLUMNS[3:]
    return COLUMNS[:3], COLUMNS[3:]


def _rows(packed, start: int, stop: int) -> dict:
    """Packs ``start:stop`` with ``seq_lens`` / ``seq_lens_offsets`` (and, for pairs, the pair columns)."""
    rows = packed.rows(start, stop)
    if not _is_pairs(packed):
        return rows
    po = np.asarray(packed.pack_offsets, np.int64)
    seqs = packed._sequences(int(po[start]), int(po[stop]))
    rows["completion_mask"] = rows["labels"] != packed.ignore_index
    rows["seq_lens"] = seqs["seq_lens"]
    rows["seq_lens_offsets"] = 2 * (po[start:stop + 1] - po[start])
    rows["seq_pairs"], rows["seq_parts"] = seqs["seq_pairs"], seqs["seq_parts"]
    rows["is_chosen"] = seqs["seq_parts"] == 1
    return rows


def _block(packed, block: int | None) -> int:
    if block is None:  # about 4M tokens (64 MB of int32 arrays) at a time
        return max(1, (1 << 22) // packed.max_len)
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    return block


def iter_batches(packed, *, block: int | None = None):
    """Yield ``(lengths, columns)`` for blocks of up to ``block`` packs (default: about 4M tokens).

    ``lengths`` is int64 [B], the real tokens of each pack; ``columns`` maps
    ``input_ids``, ``labels`` and ``position_ids`` to flat int32 arrays (the
    packs' tokens back to back, padding removed), ``seq_lengths`` to the flat
    int32 document lengths, and ``seq_offsets`` to int64 [B+1] offsets into it.
    Pairs add their per-token and per-sequence columns (:data:`PAIR_COLUMNS`).
    """
    block = _block(packed, block)
    n = len(packed)
    positions = np.arange(packed.max_len, dtype=np.int64)
    token_cols, seq_cols = _layout(packed)
    for start in range(0, n, block):
        rows = _rows(packed, start, min(start + block, n))
        seq_lens = np.asarray(rows["seq_lens"], dtype=np.int32)
        seq_off = np.asarray(rows["seq_lens_offsets"], dtype=np.int64)
        cs = np.concatenate([[0], np.cumsum(seq_lens, dtype=np.int64)])
        lengths = cs[seq_off[1:]] - cs[seq_off[:-1]]
        keep = positions[None, :] < lengths[:, None]
        columns = {c: np.ascontiguousarray(rows[c][keep], dtype=bool if c in _BOOL else np.int32)
                   for c in token_cols}
        columns["seq_lengths"] = seq_lens
        for c in seq_cols[1:]:
            columns[c] = np.asarray(rows[c], dtype=bool if c in _BOOL else np.int32)
        columns["seq_offsets"] = seq_off
        yield lengths, columns


def _arrow_batch(lengths, columns, layout):
    import pyarrow as pa

    token_cols, seq_cols = layout
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    arrays = [pa.ListArray.from_arrays(offsets, pa.array(columns[c])) for c in token_cols]
    seq_offsets = pa.array(columns["seq_offsets"].astype(np.int32))
    arrays += [pa.ListArray.from_arrays(seq_offsets, pa.array(columns[c])) for c in seq_cols]
    return pa.RecordBatch.from_arrays(arrays, schema=_schema(layout))


def _schema(layout):
    import pyarrow as pa

    return pa.schema([(c, pa.list_(pa.bool_() if c in _BOOL else pa.int32())) for c in layout[0] + layout[1]])


def _write_parquet(packed, dest: pathlib.Path, block: int) -> None:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError('parquet export needs pyarrow: pip install "vecpack[parquet]"') from e
    layout = _layout(packed)
    with pq.ParquetWriter(dest, _schema(layout), compression="zstd") as writer:
        for lengths, columns in iter_batches(packed, block=block):
            writer.write_batch(_arrow_batch(lengths, columns, layout))


def _write_jsonl(packed, dest: pathlib.Path, block: int) -> None:
    token_cols, seq_cols = _layout(packed)
    with open(dest, "w", encoding="utf-8") as f:
        for lengths, columns in iter_batches(packed, block=block):
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            lists = {c: columns[c].tolist() for c in token_cols + seq_cols}
            so = columns["seq_offsets"]
            for i in range(len(lengths)):
                a, b = int(bounds[i]), int(bounds[i + 1])
                row = {c: lists[c][a:b] for c in token_cols}
                row.update({c: lists[c][so[i]:so[i + 1]] for c in seq_cols})
                f.write(json.dumps(row, separators=(",", ":")))
                f.write("\n")


def _write_hf(packed, dest: pathlib.Path, block: int) -> None:
    try:
        import datasets
        import pyarrow as pa
    except ImportError as e:
        raise ImportError('hf export needs datasets: pip install "vecpack[hf]"') from e
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.") as tmp:
        stream = pathlib.Path(tmp) / "packs.arrow"
        layout = _layout(packed)
        with pa.OSFile(str(stream), "wb") as sink, pa.ipc.new_stream(sink, _schema(layout)) as writer:
            for lengths, columns in iter_batches(packed, block=block):
                writer.write_batch(_arrow_batch(lengths, columns, layout))
        ds = datasets.Dataset.from_file(str(stream))  # memory-mapped, no copy
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()
        try:
            ds.save_to_disk(str(dest))
        finally:
            if bars:
                datasets.enable_progress_bars()
        del ds


def export(packed, dest: str | os.PathLike, format: str = "parquet", *, overwrite: bool = False,
           block: int | None = None, pad_seq_to_mult: int | None = None, pad_id: int | None = None,
           metadata: str | os.PathLike | None = None) -> pathlib.Path:
    """Write ``packed`` to ``dest`` as ``parquet``, ``jsonl``, ``hf`` or ``megatron``; return ``dest``.

    Args:
        packed: a :class:`vecpack.Packed` (e.g. from :func:`vecpack.load`), or
            a :class:`~vecpack.packing.pairs.PackedPairs` (pair columns added).
        dest: a file (parquet, jsonl; megatron: ``.npy`` or ``.idx.parquet``) or a directory (hf).
        format: ``"parquet"``, ``"jsonl"``, ``"hf"``, or ``"megatron"``: what
            Megatron-Bridge and NeMo read for packed fine-tuning, plus its metadata
            JSON (:mod:`vecpack.integrations.export`).
        overwrite: replace ``dest`` if it exists (otherwise that is an error).
        block: packs converted at a time (bounds memory; default about 4M tokens).
        pad_seq_to_mult, pad_id: ``megatron`` only: each document padded to this multiple
            (default: the plan's ``pad_to_multiple_of``) with ``pad_id`` (pass the
            tokenizer's EOS id; default ``packed.pad_id``).
        metadata: ``megatron`` only: the metadata JSON, appended to as Megatron-Bridge
            does (default ``<max_len>_metadata.jsonl`` next to ``dest``).

    The output is written next to ``dest`` and renamed into place when
    complete, so an interrupted export leaves no partial file behind.
    """
    check_choice(format, "format", FORMATS)
    megatron_only = {"pad_seq_to_mult": pad_seq_to_mult, "pad_id": pad_id, "metadata": metadata}
    given = [k for k, v in megatron_only.items() if v is not None]
    if format != "megatron" and given:
        raise ValueError(f"{', '.join(given)} apply to format='megatron' only")
    dest = pathlib.Path(dest)
    if dest.exists() and not overwrite:
        raise FileExistsError(f"{dest} already exists; pass overwrite=True to replace it")
    if not dest.parent.is_dir():
        raise FileNotFoundError(f"{dest.parent}: no such directory")
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.partial"
    result = None
    if format == "megatron":
        check_dest(dest)

        def writer(packed, tmp, block):
            return write_megatron(packed, tmp, dest=dest, pad_seq_to_mult=pad_seq_to_mult, pad_id=pad_id,
                                            block=block)
    else:
        writer = {"parquet": _write_parquet, "jsonl": _write_jsonl, "hf": _write_hf}[format]
    try:
        result = writer(packed, tmp, block)
        if dest.exists():
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        os.replace(tmp, dest)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
    if format == "megatron":
        write_metadata(result, metadata if metadata is not None
                                 else default_metadata_path(dest, packed.max_len))
    return dest


def export_megatron(packed, dest: str | os.PathLike, *, pad_seq_to_mult: int | None = None, pad_id: int | None = None,
                    metadata: str | os.PathLike | None = None, overwrite: bool = False,
                    block: int | None = None) -> pathlib.Path:
    """``export(packed, dest, "megatron", ...)``: Megatron-Bridge / NeMo packed fine-tuning files.

    ``dest`` ends in ``.idx.parquet`` (``GPTSFTPackedParquetDataset``, Megatron-Bridge's
    default) or ``.npy`` (``GPTSFTPackedDataset``); the metadata JSON goes to
    ``metadata`` (default ``<max_len>_metadata.jsonl`` next to ``dest``). Pass the
    tokenizer's EOS id as ``pad_id`` and ``2 * cp_size`` (or the plan's
    ``pad_to_multiple_of``, the default) as ``pad_seq_to_mult``. See
    :mod:`vecpack.integrations.export`.
    """
    return export(packed, dest, "megatron", overwrite=overwrite, block=block, pad_seq_to_mult=pad_seq_to_mult,
                  pad_id=pad_id, metadata=metadata)


#: Output file endings: the legacy ``.npy`` and the parquet that Megatron-Bridge's builder now writes.
NPY_SUFFIXES = (".npy",)
PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass
class MegatronBlock:
    """Consecutive packs in Megatron's layout, as flat arrays.

    Attributes:
        start: the index of the first pack.
        input_ids: int32, every pack's stored tokens back to back.
        loss_mask: bool, aligned with ``input_ids`` (rolled: the next token's).
        pack_offsets: int64 [B+1], pack ``i`` is ``input_ids[pack_offsets[i]:pack_offsets[i+1]]``.
        seq_start_id: int64, each document's start inside its pack.
        seq_offsets: int64 [B+1], pack ``i``'s documents are ``seq_start_id[seq_offsets[i]:seq_offsets[i+1]]``.
        runtime: int64, each document's Megatron length (stored length - 1), padded.
    """

    start: int
    input_ids: np.ndarray
    loss_mask: np.ndarray
    pack_offsets: np.ndarray
    seq_start_id: np.ndarray
    seq_offsets: np.ndarray
    runtime: np.ndarray

    def __len__(self) -> int:
        return self.pack_offsets.shape[0] - 1

    def rows(self) -> list[dict]:
        """The packs as Megatron's dicts (``input_ids``, ``loss_mask`` arrays; ``seq_start_id`` a list)."""
        po, so = self.pack_offsets, self.seq_offsets
        starts = self.seq_start_id.tolist()
        return [{"input_ids": self.input_ids[po[i]:po[i + 1]], "loss_mask": self.loss_mask[po[i]:po[i + 1]],
                 "seq_start_id": starts[so[i]:so[i + 1]]} for i in range(len(self))]


def _check_packed(packed) -> None:
    kind = packed.layout.name if hasattr(packed, "layout") else type(packed).__name__  # (PackedPairs, ...)
    if getattr(packed, "kind", "packed") != "packed" or not hasattr(packed, "rows"):
        raise TypeError(f"Megatron's packed format holds SFT documents: export a vecpack.Packed, not a {kind}")


def _entries(packed, start: int, stop: int, multiple: int, max_len: int) -> dict:
    """The layout of packs ``start:stop`` from their plan alone: per entry its Megatron (runtime) length,
    stored length and start in the block's flat arrays; per pack its offsets. Raises for a pack that
    does not fit ``max_len`` once padded."""
    po = np.asarray(packed.plan.pack_offsets[start:stop + 1], np.int64)
    seq_lens = np.asarray(packed.plan.doc_length[po[0]:po[-1]], np.int64)
    seq_off = po - po[0]
    runtime = np.maximum(seq_lens - 1, 0)
    if multiple > 1:
        runtime = (runtime + (multiple - 1)) // multiple * multiple
    stored = runtime + 1  # (a 1-token document: runtime 0, stored 1)
    per_pack = np.add.reduceat(runtime, seq_off[:-1]) if stop > start else np.zeros(0, np.int64)
    over = np.flatnonzero(per_pack > max_len)
    if over.size:
        i = int(over[0])
        raise ValueError(f"pack {start + i} holds {int(per_pack[i])} tokens once each document is padded to a "
                         f"multiple of pad_seq_to_mult={multiple}, more than pack_size={max_len} "
                         f"({over.size} such packs in packs {start}..{stop - 1}): build the packs "
                         f"with pad_to_multiple_of={multiple} (vecpack.build(..., pad_to_multiple_of={multiple}), "
                         f"vecpack pack --pad-to-multiple-of {multiple})")
    out_start = np.cumsum(stored) - stored
    pack_stored = np.add.reduceat(stored, seq_off[:-1]) if stop > start else np.zeros(0, np.int64)
    pack_offsets = np.concatenate([[0], np.cumsum(pack_stored)]).astype(np.int64)
    seq_start_id = out_start - np.repeat(pack_offsets[:-1], np.diff(seq_off))
    return {"seq_lens": seq_lens, "seq_off": seq_off, "runtime": runtime, "stored": stored,
            "out_start": out_start, "pack_offsets": pack_offsets, "seq_start_id": seq_start_id}


def _fill_kernel(packed, start: int, stop: int, lay: dict, pad_id: int):
    """The block's tokens and loss mask, written by the parallel kernel straight from the corpus."""
    total = int(lay["pack_offsets"][-1])
    ids, mask = np.empty(total, np.int32), np.empty(total, bool)
    tokens, labels, _ = packed._parts[0]  # the read-only views Packed hands its own kernels
    _kernels.fill_megatron(tokens, labels, packed._offsets, packed._doc_index, packed._doc_start,
                           packed._doc_length, packed._pack_offsets, start, stop - start,
                           _ro(lay["out_start"]), _ro(lay["stored"]), pad_id, packed.ignore_index, ids, mask)
    return ids, mask


def _fill_rows(packed, start: int, stop: int, lay: dict, pad_id: int):
    """The same from ``packed.rows`` (a corpus in parts: a mixture's), in numpy."""
    rows = packed.rows(start, stop)
    seq_lens, seq_off = lay["seq_lens"], lay["seq_off"]
    cs = np.concatenate([[0], np.cumsum(seq_lens)])
    lengths = cs[seq_off[1:]] - cs[seq_off[:-1]]
    keep = np.arange(rows["input_ids"].shape[1])[None, :] < lengths[:, None]
    tokens, trained = rows["input_ids"][keep], rows["labels"][keep] != packed.ignore_index
    dest = np.arange(tokens.shape[0], dtype=np.int64) + np.repeat(lay["out_start"] - cs[:-1], seq_lens)
    total = int(lay["pack_offsets"][-1])
    ids = np.full(total, pad_id, np.int32)
    ids[dest] = tokens
    has_next = np.ones(tokens.shape[0], bool)
    has_next[cs[1:] - 1] = False  # a document's last token predicts nothing
    mask = np.zeros(total, bool)
    mask[dest[has_next]] = trained[1:][has_next[:-1]]
    return ids, mask


def _block_of(packed, start: int, stop: int, multiple: int, pad_id: int) -> MegatronBlock:
    lay = _entries(packed, start, stop, multiple, packed.max_len)
    fill = _fill_kernel if len(packed._parts) == 1 else _fill_rows
    ids, mask = fill(packed, start, stop, lay, pad_id)
    return MegatronBlock(start, ids, mask, lay["pack_offsets"], lay["seq_start_id"], lay["seq_off"], lay["runtime"])


def _default_block(max_len: int) -> int:
    return max(1, (1 << 22) // max_len)  # about 4M tokens a block (a parquet row group)


def megatron_blocks(packed, *, pad_seq_to_mult: int | None = None, pad_id: int | None = None,
                    block: int | None = None):
    """Yield ``packed`` in Megatron's layout, :class:`MegatronBlock` after block, in pack order.

    Each block is written by a numba kernel, in parallel over its packs (every
    core numba may use), straight from the corpus and the plan.

    Args:
        packed: a :class:`vecpack.Packed` of chat (SFT) documents.
        pad_seq_to_mult: pad each document's Megatron length to this multiple
            (``2 * cp_size`` for THD context parallelism); default: the plan's
            ``pad_to_multiple_of`` (1 when it had none). ``max_len`` must be a multiple of it.
        pad_id: the padding token; Megatron pads with the tokenizer's EOS and
            its collate cuts a document's logical length at its last non-EOS
            token, so pass the EOS id. Default: ``packed.pad_id``.
        block: packs per block (default about 4M tokens).

    Raises:
        ValueError: a pack that would not fit ``max_len`` once padded, naming it.
    """
    _check_packed(packed)
    max_len = packed.max_len
    multiple = packed.stats.get("pad_to_multiple_of", 1) if pad_seq_to_mult is None else pad_seq_to_mult
    multiple = check_pad_multiple(multiple, max_len, "pad_seq_to_mult")
    pad_id = packed.pad_id if pad_id is None else check_int(pad_id, "pad_id", minimum=-2**31, maximum=2**31 - 1)
    block = _default_block(max_len) if block is None else check_int(block, "block", minimum=1)
    n = len(packed)
    for s in range(0, n, block):
        yield _block_of(packed, s, min(s + block, n), multiple, pad_id)


class _Metadata:
    """Megatron-Bridge's packing metadata (``create_packing_strategy``), accumulated block by block."""

    def __init__(self, pack_size: int):
        self.pack_size = pack_size
        self.num_seqs = self.num_packs = self.total = 0
        self.max_seqlen = self.max_per_bin = 0
        self.min_packed = None

    def add(self, b: MegatronBlock) -> None:
        if not len(b):
            return
        per_pack = np.add.reduceat(b.runtime, b.seq_offsets[:-1])
        self.num_seqs += int(b.runtime.shape[0])
        self.num_packs += len(b)
        self.total += int(per_pack.sum())
        self.max_seqlen = max(self.max_seqlen, int(b.runtime.max()))
        self.max_per_bin = max(self.max_per_bin, int(np.diff(b.seq_offsets).max()))
        low = int(per_pack.min())
        self.min_packed = low if self.min_packed is None else min(self.min_packed, low)

    def result(self) -> dict:
        if not self.num_packs:
            raise ValueError("packed has no packs: nothing to export")
        # the same expressions, in the same order, as Megatron-Bridge's create_packing_strategy
        return {"dataset_max_seqlen": self.max_seqlen, "max_samples_per_bin": self.max_per_bin,
                "packing_factor": round(self.num_seqs / self.num_packs, 2),
                "packing_efficiency": round(self.total / self.num_packs / self.pack_size * 100, 2),
                "pack_size": self.pack_size, "min_packed_seqlen": self.min_packed}


def megatron_metadata(packed, *, pad_seq_to_mult: int | None = None) -> dict:
    """The metadata dict Megatron-Bridge writes for ``packed`` (see :func:`megatron_blocks`), without writing."""
    meta = _Metadata(packed.max_len)
    for b in megatron_blocks(packed, pad_seq_to_mult=pad_seq_to_mult):
        meta.add(b)
    return meta.result()


def _prefetched(blocks):
    """``blocks``, the next one computed in a thread while the caller writes this one (the fill kernel and
    pyarrow's encoder both release the GIL)."""
    with ThreadPoolExecutor(1, thread_name_prefix="vecpack-megatron") as pool:
        ahead = pool.submit(next, blocks, None)
        while True:
            b = ahead.result()
            if b is None:
                return
            ahead = pool.submit(next, blocks, None)
            yield b


def _write_megatron_parquet(blocks, dest: pathlib.Path, meta: _Metadata) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError('the Megatron parquet export needs pyarrow: pip install "vecpack[parquet]"') from e
    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
                        ("seq_start_id", pa.list_(pa.int32()))])
    # pyarrow's default compression (snappy, as Megatron-Bridge's write_packed_parquet gets); token ids are
    # not worth a dictionary
    with pq.ParquetWriter(dest, schema, use_dictionary=False, write_statistics=False) as writer:
        for b in _prefetched(blocks):
            meta.add(b)
            offsets = pa.array(b.pack_offsets.astype(np.int32))  # (a block holds about 4M tokens)
            seq_offsets = pa.array(b.seq_offsets.astype(np.int32))
            batch = pa.RecordBatch.from_arrays([
                pa.ListArray.from_arrays(offsets, pa.array(b.input_ids)),
                pa.ListArray.from_arrays(offsets, pa.array(b.loss_mask.view(np.int8))),
                pa.ListArray.from_arrays(seq_offsets, pa.array(b.seq_start_id.astype(np.int32))),
            ], schema=schema)
            writer.write_batch(batch)


def _write_megatron_npy(blocks, dest: pathlib.Path, meta: _Metadata) -> None:
    rows = []
    for b in blocks:
        meta.add(b)
        rows.extend(b.rows())
    arr = np.empty(len(rows), dtype=object)
    arr[:] = rows
    with open(dest, "wb") as f:
        np.save(f, arr, allow_pickle=True)


def check_dest(dest: str | os.PathLike) -> str:
    """``"npy"`` or ``"parquet"``, from the name of ``dest``; a ``ValueError`` for any other name."""
    return _format_of(pathlib.Path(dest))


def _format_of(dest: pathlib.Path) -> str:
    name = dest.name.lower()
    if name.endswith(NPY_SUFFIXES):
        return "npy"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    raise ValueError(f"{dest}: the Megatron export writes a .npy (GPTSFTPackedDataset) or a .idx.parquet "
                     f"(GPTSFTPackedParquetDataset) file; name it e.g. training_<pack_size>.idx.parquet")


def default_metadata_path(dest: str | os.PathLike, pack_size: int) -> pathlib.Path:
    """Megatron-Bridge's default metadata file, ``<pack_size>_metadata.jsonl``, next to ``dest``."""
    return pathlib.Path(dest).parent / f"{pack_size}_metadata.jsonl"


def write_megatron(packed, tmp: str | os.PathLike, *, dest: str | os.PathLike | None = None,
                   pad_seq_to_mult: int | None = None, pad_id: int | None = None, block: int | None = None) -> dict:
    """Write ``packed`` to the file ``tmp`` in Megatron's packed format; return its metadata dict.

    The format (``.npy`` or parquet) follows the name of ``dest`` (default
    ``tmp``). :func:`vecpack.integrations.export.export` is the front door: it
    writes next to the destination, renames into place and writes the metadata
    JSON (:func:`write_metadata`). Arguments as :func:`megatron_blocks`.
    """
    fmt = _format_of(pathlib.Path(dest if dest is not None else tmp))
    meta = _Metadata(packed.max_len)
    blocks = megatron_blocks(packed, pad_seq_to_mult=pad_seq_to_mult, pad_id=pad_id, block=block)
    (_write_megatron_npy if fmt == "npy" else _write_megatron_parquet)(blocks, pathlib.Path(tmp), meta)
    return meta.result()


def write_metadata(meta: dict, path: str | os.PathLike) -> pathlib.Path:
    """Append ``meta`` to the metadata JSON list at ``path`` (created if missing), as Megatron-Bridge does.

    Megatron-Bridge keeps one dict per packed file (train and validation) in one
    list and takes the maximum / minimum over them; re-exporting the same file
    adds an equal dict, which changes neither.
    """
    path = pathlib.Path(path)
    entries = []
    if path.exists():
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a JSON list of packing metadata ({e}); remove it or pass another "
                             f"metadata path") from None
        if not isinstance(entries, list):
            raise ValueError(f"{path}: expected a JSON list of packing metadata, got {type(entries).__name__}")
    entries.append(meta)
    tmp = path.parent / f".{path.name}.{os.getpid()}.partial"
    tmp.write_text(json.dumps(entries), encoding="utf-8")
    os.replace(tmp, path)
    return path
