"""Corpus labels stored as one bit a token (``trained.npy``) in the cache: same packs, an 8th of the size."""

import json
import os
import warnings

import numpy as np
import pytest

import vecpack
from vecpack.pipeline import route as _build
from vecpack.store.cache import CacheWarning
from vecpack.tokenizing.merge import ChunkMerger, trained_bits
from vecpack.tokenizing.tasks import ChunkMeta
from vecpack.tokenizing.tokenized import bits_to_labels


def _everything(p) -> dict:
    """Every array a reader of ``p`` can get: the fill, one pack, the corpus labels, a document, the stats."""
    out = {k: np.array(v) for k, v in p.rows(0, len(p)).items()}
    out.update({f"pack-1 {k}": v for k, v in p[len(p) - 1].items()})
    out["token_labels"] = np.array(p.token_labels)
    out["document 3"] = np.array(p.document(3)[1])
    out["trained_tokens"] = np.array(p.stats["trained_tokens"])
    return out


@pytest.fixture
def chats(tmp_path):
    from vecpack.testing import make_sharegpt

    return make_sharegpt(tmp_path / "chat.jsonl", 400, seed=9, median_user=40, median_assistant=150)


@pytest.mark.parametrize("engine", ["fastokens", "tiktoken", "tokenizers"])
def test_bits_give_the_packs_int32_labels_gave_on_every_engine(engine, qwen_dir, chats, tmp_path, monkeypatch):
    from vecpack.tokenizing.encoder import ChatEncoder

    enc = ChatEncoder.from_tokenizer(str(qwen_dir), backend=engine)
    if enc.backend != engine:
        pytest.skip(f"{engine} is not available here ({enc.backend_reason})")
    bits = vecpack.build(chats, None, 1024, encoder=enc, cache_dir=tmp_path / "bits", n_jobs=2, progress=False)
    monkeypatch.setattr(_build, "stores_bits", lambda encoder, tokenize=None: False)   # the layout before
    ints = vecpack.build(chats, None, 1024, encoder=enc, cache_dir=tmp_path / "ints", n_jobs=2, progress=False)
    a, b = bits.build_info.corpus_path, ints.build_info.corpus_path
    assert (a / "trained.npy").exists() and not (a / "labels.npy").exists()
    assert (b / "labels.npy").exists() and not (b / "trained.npy").exists()
    size = {d: sum(f.stat().st_size for f in d.iterdir()) for d in (a, b)}
    assert size[a] < 0.6 * size[b]
    got, want = _everything(bits), _everything(ints)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # saved with its bits, loaded the same, whether linked or copied
    out = vecpack.save(bits, tmp_path / "ds")
    assert (out / "trained.npy").exists()
    loaded = _everything(vecpack.load(out, verify=True))
    for k in want:
        np.testing.assert_array_equal(loaded[k], want[k], err_msg=k)


def _chunks(rng, n_chunks, other_labels_in=None, longest=40):
    """Chunks of (tokens, labels, lengths): labels the token or -100, except in chunk ``other_labels_in``."""
    out = []
    for i in range(n_chunks):
        lengths = rng.integers(1, longest, size=rng.integers(1, 6)).astype(np.int64)
        tokens = rng.integers(0, 1000, size=int(lengths.sum())).astype(np.int32)
        labels = np.where(rng.random(tokens.shape[0]) < 0.6, tokens, -100).astype(np.int32)
        if i == other_labels_in:
            labels = np.roll(tokens, -1)                # shifted labels: not bits
        out.append((tokens, labels, lengths))
    return out


@pytest.mark.parametrize("longest", [40, 4])
@pytest.mark.parametrize("other", [None, 0, 3, 6])
def test_the_merger_writes_bits_or_falls_back_to_exact_labels(other, longest, tmp_path):
    """Direct and file chunks in any order, as the workers make them; a chunk whose labels are not
    bits turns the whole corpus to labels.npy, the labels before it decoded from the bits.
    ``longest`` 4: chunks of a few tokens, several in one byte of bits."""
    rng = np.random.default_rng(5 + (other or 0) + longest)
    chunks = _chunks(rng, 7 if longest > 4 else 30, other, longest)
    order = (2, 0, 1, 4, 3, 6, 5) if longest > 4 else [i + (i % 5 == 3) - (i % 5 == 4) for i in range(30)]
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    with trained_bits():
        merger = ChunkMerger(str(out))
    target = merger.direct_target(str(work), len(chunks))
    metas = []
    for i in order:
        tokens, labels, lengths = chunks[i]
        meta = ChunkMeta(i, str(work), records=len(lengths), documents=len(lengths), tokens=len(tokens),
                         trainable=0, lines=len(lengths), rejected=0, lengths=lengths,
                         rows=np.arange(len(lengths), dtype=np.int64))
        # the row lane hands its mask with its labels (Rows.mask), where its labels are bits: the same files
        mask = tokens == labels if i % 2 == 0 and ((labels == tokens) | (labels == -100)).all() else None
        edges = target.write(i, tokens, labels, mask) if i % 3 != 1 or longest == 4 else None   # some as files
        if edges is not None:
            meta.direct, meta.edges = True, edges
        else:
            for name, arr in (("tokens", tokens), ("labels", labels)):
                np.save(meta.path(name), arr)
        metas.append(meta)
    for m in metas:
        merger.add(m)
    t = merger.finish()
    tokens = np.concatenate([c[0] for c in chunks])
    labels = np.concatenate([c[1] for c in chunks])
    np.testing.assert_array_equal(t.tokens, tokens)
    np.testing.assert_array_equal(t.labels, labels)
    files = sorted(os.listdir(out))
    if other is None:
        assert files == ["offsets.npy", "row_ids.npy", "tokens.npy", "trained.npy"]
        np.testing.assert_array_equal(bits_to_labels(tokens, np.load(out / "trained.npy")), labels)
    else:
        assert files == ["labels.npy", "offsets.npy", "row_ids.npy", "tokens.npy"]
        np.testing.assert_array_equal(np.load(out / "labels.npy"), labels)
    assert [p for p in os.listdir(work) if not p.startswith("counts-")] == []   # no scratch left
    # without trained_bits() (vecpack.tokenize(out_dir=...)): labels.npy, as before
    assert "labels" in ChunkMerger(str(tmp_path / "plain")).files


def test_split_bits_against_packbits():
    """A chunk's edge flags and whole bytes, at every offset into a byte: put back in place they
    are ``np.packbits`` of the corpus's flags."""
    from vecpack.tokenizing.merge import split_bits

    rng = np.random.default_rng(2)
    for n in (0, 1, 5, 8, 9, 23, 64):
        for at in range(17):
            mask = rng.random(n) < 0.5
            head, whole, tail = split_bits(mask, at)
            assert head.shape[0] == min((-at) % 8, n) and tail.shape[0] < 8
            assert (at + head.shape[0]) % 8 == 0 or not whole.size
            corpus = np.concatenate([np.zeros(at, bool), mask, np.zeros(16, bool)])
            want = np.packbits(corpus, bitorder="little")
            k = (at + head.shape[0]) // 8
            assert whole.tobytes() == want[k:k + whole.size].tobytes()
            np.testing.assert_array_equal(np.concatenate([head, np.unpackbits(whole, bitorder="little").view(bool),
                                                          tail]), mask)


def test_an_entry_of_the_old_layout_is_rebuilt_not_misread(chats, qwen_dir, tmp_path):
    cache = tmp_path / "cache"
    first = vecpack.build(chats, str(qwen_dir), 1024, cache_dir=cache, n_jobs=1, progress=False)
    want = _everything(first)
    corpus = first.build_info.corpus_path
    # what vecpack before the bits wrote: labels.npy, layout 1 (its manifest consistent with its files)
    tokens = np.load(corpus / "tokens.npy")
    np.save(corpus / "labels.npy", bits_to_labels(tokens, np.load(corpus / "trained.npy")))
    os.unlink(corpus / "trained.npy")
    from vecpack.store.entries import describe_arrays

    for d in (corpus, first.build_info.plan_path):
        m = json.loads((d / "manifest.json").read_text())
        m["layout"], m["arrays"] = 1, describe_arrays(d)
        (d / "manifest.json").write_text(json.dumps(m))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = vecpack.build(chats, str(qwen_dir), 1024, cache_dir=cache, n_jobs=1, progress=False)
    assert not again.build_info.corpus_hit and not again.build_info.plan_hit
    assert any(issubclass(w.category, CacheWarning) and "layout 1" in str(w.message) for w in caught)
    assert (corpus / "trained.npy").exists() and not (corpus / "labels.npy").exists()
    got = _everything(again)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_which_corpora_keep_int32_labels():
    from vecpack.tokenizing.encoder import ChatEncoder

    assert _build.stores_bits(None)                                   # a tokenizer: vecpack's own encoders
    assert _build.stores_bits(ChatEncoder.__new__(ChatEncoder))
    assert not _build.stores_bits(object())                           # a caller's encoder: any labels
    assert not _build.stores_bits(None, tokenize=lambda *a, **k: None)   # torchtune's ds[i] items


def test_packed_checks_the_size_of_bits():
    tokens = np.arange(20, dtype=np.int32)
    p = vecpack.plan(np.array([20]), 32)
    with pytest.raises(ValueError, match="3 bytes"):
        vecpack.Packed(tokens, np.array([0, 20]), p, labels=np.zeros(2, np.uint8))
    bits = np.packbits(tokens % 3 == 0, bitorder="little")
    packed = vecpack.Packed(tokens, np.array([0, 20]), p, labels=bits)
    want = np.where(tokens % 3 == 0, tokens, -100)
    want[0] = -100
    np.testing.assert_array_equal(packed[0]["labels"][:20], want)
    np.testing.assert_array_equal(packed.labels[0, :20], want)
