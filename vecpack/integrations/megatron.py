"""Megatron-Bridge / NeMo packed fine-tuning files, written from vecpack's packs.

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from vecpack.options import check_int, check_pad_multiple
from vecpack.packing import _fill_kernels as _kernels
from vecpack.packing.plan import _ro

__all__ = ["MegatronBlock", "check_dest", "default_metadata_path", "megatron_blocks", "megatron_metadata",
           "write_megatron", "write_metadata"]

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


def _write_parquet(blocks, dest: pathlib.Path, meta: _Metadata) -> None:
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


def _write_npy(blocks, dest: pathlib.Path, meta: _Metadata) -> None:
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
    (_write_npy if fmt == "npy" else _write_parquet)(blocks, pathlib.Path(tmp), meta)
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
