"""Export a packed dataset for trainers that read padding-free packs (TRL and friends).

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
``.idx.parquet`` and its metadata JSON: :mod:`vecpack.integrations.megatron`) and
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
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import numpy as np

from vecpack.integrations import megatron as _megatron
from vecpack.options import EXPORT_FORMATS, check_choice

__all__ = ["COLUMNS", "FORMATS", "PAIR_COLUMNS", "export", "export_megatron", "iter_batches"]

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
            JSON (:mod:`vecpack.integrations.megatron`).
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
        _megatron.check_dest(dest)

        def writer(packed, tmp, block):
            return _megatron.write_megatron(packed, tmp, dest=dest, pad_seq_to_mult=pad_seq_to_mult, pad_id=pad_id,
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
        _megatron.write_metadata(result, metadata if metadata is not None
                                 else _megatron.default_metadata_path(dest, packed.max_len))
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
    :mod:`vecpack.integrations.megatron`.
    """
    return export(packed, dest, "megatron", overwrite=overwrite, block=block, pad_seq_to_mult=pad_seq_to_mult,
                  pad_id=pad_id, metadata=metadata)
