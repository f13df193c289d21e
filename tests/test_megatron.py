"""Issue 52: Megatron-Bridge's packed fine-tuning format (vecpack.integrations.export, export --format megatron).

Megatron-Bridge (0.4+) needs Python 3.12 and cannot be installed here, so its
reading code is re-implemented below, following it step by step (NVIDIA-NeMo/
Megatron-Bridge, ``src/megatron/bridge/``):

* ``utils/safe_pickle.py``: ``safe_load_npy`` and ``_NumpyRestrictedUnpickler``
  (the allowlist the ``.npy`` must pass);
* ``data/packing/gpt_sft.py``: ``GPTSFTPackedDataset.__getitem__``,
  ``_build_loss_mask`` (``answer_only_loss=True``, the default) and ``collate_fn``
  (``return_cu_seqlen=True``, ``pad_to_max_length=True``, with and without
  ``pad_seq_to_mult``), and ``GPTSFTDataset._collate_item`` / ``_maybe_cast_to_list``;
* ``data/packing/parquet.py``: ``GPTSFTPackedParquetDataset.__getitem__``
  (a row group read, ``as_py``);
* ``data/packing/algorithms.py``: ``create_packing_strategy``'s metadata.

Files written by vecpack and read that way must give back the tokens, labels,
loss masks and ``cu_seqlens`` that vecpack's packs hold.
"""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest

import vecpack
from vecpack.integrations.export import export, megatron_blocks, megatron_metadata

EOS = 0          # the pad / EOS id: never a token of the documents below
MAX_LEN = 96


# --------------------------------------------------------------------------- Megatron-Bridge's reading code


class _NumpyRestrictedUnpickler(pickle.Unpickler):
    """utils/safe_pickle.py: builtins and the numpy types an object array needs, nothing else."""

    _SAFE = {
        "builtins": {"list", "dict", "tuple", "set", "frozenset", "bytes", "bytearray", "str", "int", "float",
                     "bool", "complex", "slice", "range", "NoneType"},
        "collections": {"OrderedDict"},
        "numpy": {"ndarray", "dtype"},
        "numpy.core.multiarray": {"_reconstruct", "scalar"},
        "numpy._core.multiarray": {"_reconstruct", "scalar"},
        "_codecs": {"encode"},
    }

    def find_class(self, module, name):
        if module in self._SAFE and name in self._SAFE[module]:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Restricted unpickler refused to load '{module}.{name}'.")


def safe_load_npy(data: bytes):
    """utils/safe_pickle.py ``safe_load_npy``."""
    import numpy.lib.format as fmt

    buf = io.BytesIO(data)
    try:
        return np.load(buf, allow_pickle=False)
    except ValueError:
        pass
    buf.seek(0)
    version = fmt.read_magic(buf)
    (fmt.read_array_header_1_0 if version[0] == 1 else fmt.read_array_header_2_0)(buf)
    return np.asarray(_NumpyRestrictedUnpickler(buf).load(), dtype=object)


def npy_items(path):
    """``GPTSFTPackedDataset._load_dataset`` + ``__getitem__`` (no samples mapping)."""
    indexed = safe_load_npy(open(path, "rb").read())
    out = []
    for idx in range(len(indexed)):
        input_ids = indexed[idx]["input_ids"]
        seq_boundaries = indexed[idx]["seq_start_id"] + [len(input_ids)]
        out.append({"input_ids": input_ids, "seq_boundaries": seq_boundaries, "loss_mask": indexed[idx]["loss_mask"]})
    return out


def parquet_items(path):
    """``GPTSFTPackedParquetDataset.__getitem__`` over every row, a row group at a time."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    assert {"input_ids", "seq_start_id", "loss_mask"} <= set(pf.schema_arrow.names)
    out = []
    for g in range(pf.metadata.num_row_groups):
        table = pf.read_row_group(g, columns=["input_ids", "seq_start_id", "loss_mask"])
        for r in range(table.num_rows):
            input_ids = table.column("input_ids")[r].as_py()
            seq_start_id = table.column("seq_start_id")[r].as_py()
            out.append({"input_ids": input_ids, "seq_boundaries": seq_start_id + [len(input_ids)],
                        "loss_mask": table.column("loss_mask")[r].as_py()})
    return out


def _build_loss_mask(item):
    """``GPTSFTPackedDataset._build_loss_mask`` with ``answer_only_loss=True``."""
    b = item["seq_boundaries"]
    return np.concatenate([item["loss_mask"][b[i]:b[i + 1] - 1] for i in range(len(b) - 1)])


def _collate_item(item, max_length, pad_id):
    """``GPTSFTDataset._collate_item`` (after ``_maybe_cast_to_list``)."""
    item = [x.tolist() if isinstance(x, np.ndarray) else x for x in item]
    return [x + [pad_id] * (max_length - len(x)) for x in item]


def collate_fn(batch, max_seq_length, pad_seq_to_mult):
    """``GPTSFTPackedDataset.collate_fn`` (``return_cu_seqlen=True``, ``pad_to_max_length=True``,
    ``pad_cu_seqlens=False``), the fields it returns as lists."""
    input_ids = [np.concatenate([item["input_ids"][item["seq_boundaries"][i]:item["seq_boundaries"][i + 1] - 1]
                                 for i in range(len(item["seq_boundaries"]) - 1)]) for item in batch]
    labels = [np.concatenate([item["input_ids"][item["seq_boundaries"][i] + 1:item["seq_boundaries"][i + 1]]
                              for i in range(len(item["seq_boundaries"]) - 1)]) for item in batch]
    loss_mask = [_build_loss_mask(item) for item in batch]
    token_count = [x.shape[0] for x in input_ids]
    max_length = max_seq_length
    position_ids, cu_seqlens = [], []
    cu_seqlens_padded = [] if pad_seq_to_mult > 1 else None
    for item in batch:
        position_ids.append([])
        cu_seqlens.append([0])
        if cu_seqlens_padded is not None:
            cu_seqlens_padded.append([0])
        seqlens = np.array(item["seq_boundaries"][1:]) - np.array(item["seq_boundaries"][:-1])
        for length in seqlens:
            position_ids[-1].extend(list(range(length - 1)))
            if cu_seqlens_padded is not None:
                cu_seqlens_padded[-1].append(cu_seqlens_padded[-1][-1] + length - 1)
            else:
                cu_seqlens[-1].append(cu_seqlens[-1][-1] + length - 1)
        if cu_seqlens_padded is not None:
            assert cu_seqlens_padded[-1][-1] <= max_length
            if cu_seqlens_padded[-1][-1] != max_length:
                cu_seqlens_padded[-1].append(max_length)
            for i in range(len(item["seq_boundaries"]) - 1):
                current = np.array(item["input_ids"][item["seq_boundaries"][i]:item["seq_boundaries"][i + 1] - 1])
                non_eos = np.where(current != EOS)[0]
                cu_seqlens[-1].append(cu_seqlens[-1][-1] + (non_eos[-1] + 1 if non_eos.size > 0 else 0))
            if len(cu_seqlens_padded[-1]) > len(cu_seqlens[-1]):
                cu_seqlens[-1].append(cu_seqlens[-1][-1])
        else:
            assert cu_seqlens[-1][-1] <= max_length
            if cu_seqlens[-1][-1] != max_length:
                cu_seqlens[-1].append(max_length)
    return {"tokens": _collate_item(input_ids, max_length, EOS), "labels": _collate_item(labels, max_length, EOS),
            "loss_mask": _collate_item(loss_mask, max_length, 0),
            "position_ids": _collate_item(position_ids, max_length, 0), "token_count": token_count,
            "cu_seqlens": cu_seqlens, "cu_seqlens_padded": cu_seqlens_padded}


def megatron_metadata_of(items, pack_size):
    """``create_packing_strategy``'s metadata, from the packs as read (runtime length = stored - 1)."""
    bins = [[int(b - a) - 1 for a, b in zip(it["seq_boundaries"][:-1], it["seq_boundaries"][1:])] for it in items]
    all_seq_lens = [n for b in bins for n in b]
    packed_seq_lens = [sum(x) for x in bins]
    return {"dataset_max_seqlen": max(all_seq_lens), "max_samples_per_bin": max(len(b) for b in bins),
            "packing_factor": round(len(all_seq_lens) / len(packed_seq_lens), 2),
            "packing_efficiency": round(sum(packed_seq_lens) / len(packed_seq_lens) / pack_size * 100, 2),
            "pack_size": pack_size, "min_packed_seqlen": min(packed_seq_lens)}


# --------------------------------------------------------------------------- what vecpack's packs say


def expected(pack, m):
    """What Megatron's collate must give for one vecpack pack, written from the pack's segments."""
    tokens, labels, loss, pos, cu, cu_p = [], [], [], [], [0], [0]
    a = 0
    for n in pack["seq_lens"].tolist():
        t = pack["input_ids"][a:a + n].tolist()
        lab = pack["labels"][a:a + n].tolist()
        runtime = -(-(n - 1) // m) * m
        stored = t + [EOS] * (runtime + 1 - n)
        tokens += stored[:-1]
        labels += stored[1:]
        loss += [int(j + 1 < n and lab[j + 1] != -100) for j in range(runtime)]
        pos += list(range(runtime))
        # logical length: up to the last real token among the inputs (Megatron cuts at the last non-EOS)
        cu.append(cu[-1] + (n if runtime + 1 > n else n - 1) if m > 1 else cu[-1] + n - 1)
        cu_p.append(cu_p[-1] + runtime)
        a += n
    return tokens, labels, loss, pos, cu, cu_p


def _packed(m: int, seed: int = 0, n_docs: int = 60):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, n_docs)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(1, 500, int(offsets[-1])).astype(np.int32)
    labels = np.where(rng.random(tokens.size) < 0.4, -100, tokens).astype(np.int32)
    return vecpack.pack(tokens, offsets, MAX_LEN, labels=labels, pad_id=EOS, pad_to_multiple_of=m)


@pytest.mark.parametrize("suffix", [".npy", ".idx.parquet"])
@pytest.mark.parametrize("m", [1, 4])
def test_megatron_reads_back_vecpack_packs(tmp_path, suffix, m):
    packed = _packed(m, seed=m)
    dest = tmp_path / f"training_{MAX_LEN}{suffix}"
    export(packed, dest, "megatron", block=3)  # small blocks: several row groups / blocks
    items = npy_items(dest) if suffix == ".npy" else parquet_items(dest)
    assert len(items) == len(packed)
    for i, item in enumerate(items):
        got = collate_fn([item], MAX_LEN, m)
        tokens, labels, loss, pos, cu, cu_p = expected(packed[i], m)
        n = got["token_count"][0]
        assert n == len(tokens)
        assert got["tokens"][0][:n] == tokens and got["labels"][0][:n] == labels
        assert [int(x) for x in got["loss_mask"][0][:n]] == loss and got["position_ids"][0][:n] == pos
        if m == 1:
            assert got["cu_seqlens"][0] == cu + ([MAX_LEN] if cu[-1] != MAX_LEN else [])
        else:
            tail = [MAX_LEN] if cu_p[-1] != MAX_LEN else []
            assert got["cu_seqlens_padded"][0] == cu_p + tail
            assert got["cu_seqlens"][0] == cu + ([cu[-1]] if tail else [])
        # the trained (input, label) pairs are exactly vecpack's: label j + 1 of each document
        pairs = [(t, lb) for t, lb, w in zip(tokens, labels, loss) if w]
        want, a = [], 0
        p = packed[i]
        for s in p["seq_lens"].tolist():
            want += [(int(p["input_ids"][a + j]), int(p["labels"][a + j + 1])) for j in range(s - 1)
                     if p["labels"][a + j + 1] != -100]
            a += s
        assert pairs == want
    meta = json.loads((tmp_path / f"{MAX_LEN}_metadata.jsonl").read_text())
    assert meta == [megatron_metadata_of(items, MAX_LEN)] == [megatron_metadata(packed)]


def test_npy_and_parquet_hold_the_same_packs_and_writing_is_deterministic(tmp_path):
    packed = _packed(4, seed=7)
    export(packed, tmp_path / "a.npy", "megatron", block=2)
    export(packed, tmp_path / "b.npy", "megatron")
    export(packed, tmp_path / "c.idx.parquet", "megatron", block=5)
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()
    a, c = npy_items(tmp_path / "a.npy"), parquet_items(tmp_path / "c.idx.parquet")
    for x, y in zip(a, c, strict=True):
        assert list(x["input_ids"]) == y["input_ids"] and x["seq_boundaries"] == y["seq_boundaries"]
        assert [int(v) for v in x["loss_mask"]] == y["loss_mask"]
    meta = json.loads((tmp_path / f"{MAX_LEN}_metadata.jsonl").read_text())
    assert len(meta) == 3 and meta[0] == meta[1] == meta[2]  # appended, one per file, as Megatron does


def _variant(kind: str):
    """A Packed of each kind the kernel (or its fallback) reads: int32 labels, labels as bits, a corpus in
    parts (the numpy fallback), documents split across packs."""
    from vecpack.packing.packed import Packed
    from vecpack.packing.plan import plan

    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 40 if kind != "split" else 200, 80)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(1, 500, int(offsets[-1])).astype(np.int32)
    trained = rng.random(tokens.size) < 0.6
    labels = np.where(trained, tokens, -100).astype(np.int32)
    p = plan(lengths, MAX_LEN, long="split" if kind == "split" else "truncate", pad_to_multiple_of=8)
    if kind == "bits":
        return Packed(tokens, offsets, p, labels=np.packbits(trained, bitorder="little"), pad_id=EOS)
    if kind == "parts":
        cut = int(offsets[40])
        return Packed([tokens[:cut], tokens[cut:]], offsets, p, labels=[labels[:cut], labels[cut:]], pad_id=EOS)
    return Packed(tokens, offsets, p, labels=labels, pad_id=EOS)


@pytest.mark.parametrize("kind", ["int32", "bits", "parts", "split"])
def test_blocks_match_a_plain_python_layout(kind):
    """The kernel (and, for a corpus in parts, the numpy fallback) against the layout written out token by token."""
    packed = _variant(kind)
    rows = [r for b in megatron_blocks(packed, block=4) for r in b.rows()]
    assert len(rows) == len(packed)
    for i, row in enumerate(rows):
        p = packed[i]
        ids, lm, starts, a = [], [], [], 0
        for n in p["seq_lens"].tolist():
            starts.append(len(ids))
            runtime = -(-(n - 1) // 8) * 8
            ids += p["input_ids"][a:a + n].tolist() + [EOS] * (runtime + 1 - n)
            lm += [bool(p["labels"][a + j + 1] != -100) for j in range(n - 1)] + [False] * (runtime + 2 - n)
            a += n
        assert row["input_ids"].tolist() == ids and row["loss_mask"].tolist() == lm and row["seq_start_id"] == starts
        assert isinstance(row["seq_start_id"], list)


def test_the_plans_padding_is_the_default(tmp_path):
    padded = _packed(8, seed=4)
    assert megatron_metadata(padded)["dataset_max_seqlen"] % 8 == 0
    assert megatron_metadata(padded) == megatron_metadata(padded, pad_seq_to_mult=8)


def test_bad_input_is_named(tmp_path):
    tight = _packed(1, seed=5, n_docs=200)
    with pytest.raises(ValueError, match=r"pack \d+ holds \d+ tokens once each document is padded to a multiple of "
                                         r"pad_seq_to_mult=16, more than pack_size=96 .* pad_to_multiple_of=16"):
        export(tight, tmp_path / "x.idx.parquet", "megatron", pad_seq_to_mult=16)
    assert not list(tmp_path.iterdir())  # nothing partial left behind
    with pytest.raises(ValueError, match="max_len=96 is not a multiple of pad_seq_to_mult=7"):
        export(tight, tmp_path / "x.npy", "megatron", pad_seq_to_mult=7)
    with pytest.raises(ValueError, match=r"writes a \.npy .* or a \.idx\.parquet"):
        export(tight, tmp_path / "x.jsonl", "megatron")
    with pytest.raises(ValueError, match="pad_seq_to_mult apply to format='megatron' only"):
        export(tight, tmp_path / "x.parquet", "parquet", pad_seq_to_mult=4)
    (tmp_path / f"{MAX_LEN}_metadata.jsonl").write_text("{}")
    with pytest.raises(ValueError, match="expected a JSON list of packing metadata, got dict"):
        export(tight, tmp_path / "y.npy", "megatron")


def test_cli_export_megatron(tmp_path, qwen_dir, capsys):
    from vecpack.cli import main
    from vecpack.testing import make_sharegpt

    data = make_sharegpt(tmp_path / "chat.jsonl", 40, seed=2)
    out = tmp_path / "packed"
    cache = ["--cache-dir", tmp_path / "c"]
    assert main([str(a) for a in ["pack", data, "--tokenizer", qwen_dir, "--max-len", 512, "--pad-to-multiple-of",
                                  8, "-o", out, "--jobs", 1, *cache]]) == 0
    assert main([str(a) for a in ["export", out, "--format", "megatron", "--pad-id", EOS]]) == 0
    dest = tmp_path / "packed.idx.parquet"
    items = parquet_items(dest)
    loaded = vecpack.load(out)
    assert len(items) == len(loaded) and loaded.stats["pad_to_multiple_of"] == 8
    meta = json.loads((tmp_path / "512_metadata.jsonl").read_text())
    assert meta == [megatron_metadata_of(items, 512)]
    assert meta[0]["dataset_max_seqlen"] % 8 == 0   # the plan's padding, applied by default
    assert main([str(a) for a in ["export", out, "--format", "parquet", "-o", tmp_path / "p.parquet",
                                  "--pad-seq-to-mult", 4]]) == 2
    assert "--pad-seq-to-mult apply to --format megatron only" in capsys.readouterr().err
    assert main([str(a) for a in ["pack", data, "--tokenizer", qwen_dir, "--max-len", 500, "--pad-to-multiple-of",
                                  8, "--jobs", 1, *cache]]) != 0
    assert "max_len=500 is not a multiple of pad_to_multiple_of=8" in capsys.readouterr().err
