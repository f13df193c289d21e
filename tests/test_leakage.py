"""Packing is exact: a packed batch computes what its documents compute one at a time.

A tiny random Qwen2 / Llama model (transformers, CPU, fp32) runs each pack
through four attention paths and each plan entry (a document, its truncated
head, or one chunk of a split document) alone:

* ``sdpa-4d``    -- ``collate_flex`` + the dense ``block_causal_mask`` (SDPA);
* ``flex``       -- ``collate_flex`` + ``FlexBatch.block_mask`` through
  ``torch.nn.attention.flex_attention`` (eager, which runs on CPU);
* ``varlen``     -- ``collate_flash`` through an attention function that only
  gets the flash kwargs (``cu_seq_lens_q/k``, ``max_length_q/k``) from the
  model, as ``flash_attn_varlen_func`` would: proves the model routes them
  and that they alone keep documents apart;
* ``flat-sdpa``  -- ``collate_flash`` given to a stock ``sdpa`` model, which
  infers the segments from the restarting ``position_ids`` (because the batch
  carries ``use_cache=False``: with a KV cache transformers skips that
  detection and leaks, which the test also pins down).

Per entry, logits inside the pack equal the solo logits (atol 1e-5), and the
packed loss equals the token-weighted mean of the solo losses; one training
step's gradients match the documents' summed gradients. transformers' own
compiled ``flex_attention`` path (whose CPU kernel skips blocks by the
BlockMask's block structure) is checked too (slow). A control run with a
plain causal mask must fail the same check.
"""


import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers import flex_eager_attention  # noqa: E402

import vecpack  # noqa: E402
from vecpack.integrations.collate import collate_flash, collate_flex  # noqa: E402
from vecpack.integrations.masks import block_causal_mask  # noqa: E402

VOCAB = 1000
MAX_LEN = 48
ATOL = 1e-5



def _varlen_reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                                cu_seq_lens_q=None, cu_seq_lens_k=None, max_length_q=None,
                                max_length_k=None, **kwargs):
    """flash_attn_varlen_func's contract, in plain torch: attention only inside [cu[i], cu[i+1])."""
    assert attention_mask is None
    assert cu_seq_lens_q is not None and cu_seq_lens_k is not None, "flash kwargs did not reach attention"
    assert cu_seq_lens_q.dtype == torch.int32 and isinstance(max_length_q, int)
    assert query.shape[0] == 1
    cu = cu_seq_lens_q.tolist()
    assert cu_seq_lens_k.tolist() == cu and cu[-1] == query.shape[2]
    assert max_length_q == max_length_k == max(b - a for a, b in zip(cu, cu[1:]))
    out = torch.empty_like(query)
    for a, b in zip(cu, cu[1:]):
        out[:, :, a:b] = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


transformers.AttentionInterface.register("vecpack_flex_eager", flex_eager_attention)
transformers.AttentionInterface.register("vecpack_varlen_reference", _varlen_reference_attention)


def _model(kind):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=0.1, rope_theta=10000.0)  # logits ~4: leaks move them by ~5
    config = (transformers.Qwen2Config if kind == "qwen2" else transformers.LlamaConfig)(**common)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0 if kind == "qwen2" else 1)
    model_cls = transformers.Qwen2ForCausalLM if kind == "qwen2" else transformers.LlamaForCausalLM
    model = model_cls(config).eval()
    with torch.no_grad():  # Qwen2's q/k/v biases start at zero; make them count
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    return model


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny matmuls: one thread is several times faster than two fighting a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus():
    """26 documents of 1..110 tokens (many longer than MAX_LEN), ~70% of tokens trainable."""
    rng = np.random.default_rng(1234)
    lengths = np.concatenate([[1, 2, MAX_LEN, MAX_LEN + 1, 2 * MAX_LEN + 5], rng.integers(1, 111, 21)])
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, VOCAB, offsets[-1]).astype(np.int32)
    labels = np.where(rng.random(offsets[-1]) < 0.7, tokens, -100).astype(np.int32)
    return tokens, offsets, labels


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request):
    return _model(request.param)


def _solo(model, tokens, labels, start, length):
    """Logits, summed loss and loss-token count of one entry run alone (its first label ignored)."""
    cache = model.__dict__.setdefault("_vecpack_solo", {})  # per model object: ids can be reused
    key = (start, length)
    if key not in cache:
        ids = torch.from_numpy(tokens[start:start + length].astype(np.int64))[None]
        lab = torch.from_numpy(labels[start:start + length].astype(np.int64))[None].clone()
        lab[0, 0] = -100
        with torch.no_grad():
            out = model(input_ids=ids, labels=lab)
        n = int((lab[0, 1:] != -100).sum())
        cache[key] = (out.logits[0], float(out.loss) * n if n else 0.0, n)
    return cache[key]


def _expected_entries(lengths, long):
    """(doc, start, length) of every entry the policy must produce, in any order."""
    out = []
    for d, n in enumerate(lengths):
        if n <= MAX_LEN:
            out.append((d, 0, n))
        elif long == "truncate":
            out.append((d, 0, MAX_LEN))
        elif long == "split":
            out += [(d, s, min(MAX_LEN, n - s)) for s in range(0, n, MAX_LEN)]
    return sorted(out)


def _run(model, impl, **inputs):
    model.config._attn_implementation = impl
    try:
        with torch.no_grad():
            return model(**inputs)
    finally:
        model.config._attn_implementation = "sdpa"


def _check(name, logits_rows, loss, entries, model, corpus):
    """logits_rows[k]: packed logits of entry k ([len, V]); loss: the packed model loss."""
    tokens, offsets, labels = corpus
    total, count = 0.0, 0
    for (doc, start, length), got in zip(entries, logits_rows):
        ref, loss_sum, n = _solo(model, tokens, labels, int(offsets[doc]) + start, length)
        err = (got - ref).abs().max().item()
        assert err <= ATOL, f"{name}: document {doc} [{start}:{start + length}] leaks: max |diff| {err:.2e}"
        total, count = total + loss_sum, count + n
    expected = total / count
    assert abs(float(loss) - expected) <= 1e-5 * max(1.0, abs(expected)), (name, float(loss), expected)


@pytest.mark.parametrize("long", ["truncate", "drop", "split"])
@pytest.mark.parametrize("strategy", ["greedy", "ffd", "bfd"])
def test_packed_equals_solo(model, corpus, strategy, long):
    tokens, offsets, labels = corpus
    packed = vecpack.pack(tokens, offsets, MAX_LEN, labels=labels, strategy=strategy, long=long)
    plan = packed.plan
    entries = list(zip(plan.doc_index.tolist(), plan.doc_start.tolist(), plan.doc_length.tolist()))
    assert sorted(entries) == _expected_entries(np.diff(offsets).tolist(), long)
    packs = [packed[i] for i in range(len(packed))]

    # [B, max_len] paths: dense SDPA mask and flex BlockMask
    flex = collate_flex(packs, block_size=16)
    rows = [(p, int(a), int(n)) for p, lens in enumerate(packed[i]["seq_lens"] for i in range(len(packed)))
            for a, n in zip(np.cumsum(lens) - lens, lens)]
    assert len(rows) == len(entries)
    common = dict(input_ids=flex["input_ids"], position_ids=flex["position_ids"], labels=flex["labels"])
    out = _run(model, "sdpa", attention_mask=block_causal_mask(flex["seq_idx"]), **common)
    _check("sdpa-4d", [out.logits[p, a:a + n] for p, a, n in rows], out.loss, entries, model, corpus)
    out = _run(model, "vecpack_flex_eager", attention_mask=flex.block_mask, **common)
    _check("flex", [out.logits[p, a:a + n] for p, a, n in rows], out.loss, entries, model, corpus)

    # padding-free [1, T] path: only the flash kwargs separate the documents
    flat = collate_flash(packs)
    cu = flat["cu_seq_lens_q"].tolist()
    out = _run(model, "vecpack_varlen_reference", **flat)
    _check("varlen", [out.logits[0, a:b] for a, b in zip(cu, cu[1:])], out.loss, entries, model, corpus)


@pytest.mark.parametrize("use_cache", [None, True])
def test_flat_batch_on_stock_sdpa(model, corpus, use_cache):
    """collate_flash's batch as is on a stock sdpa model (None): transformers infers the segments
    from position_ids because the batch carries use_cache=False. Forcing a KV cache (True) makes it
    skip that detection and attend across documents: the reason the key is in the batch."""
    tokens, offsets, labels = corpus
    packed = vecpack.pack(tokens, offsets, MAX_LEN, labels=labels, strategy="bfd", long="split")
    plan = packed.plan
    entries = list(zip(plan.doc_index.tolist(), plan.doc_start.tolist(), plan.doc_length.tolist()))
    flat = collate_flash([packed[i] for i in range(len(packed))])
    assert flat["use_cache"] is False
    if use_cache is not None:
        flat["use_cache"] = use_cache
    cu = flat["cu_seq_lens_q"].tolist()
    out = _run(model, "sdpa", **flat)
    rows = [out.logits[0, a:b] for a, b in zip(cu, cu[1:])]
    if use_cache:
        try:
            _check("flat-sdpa+cache", rows, out.loss, entries, model, corpus)
        except AssertionError as e:
            assert "leaks" in str(e)
        else:
            pytest.skip("this transformers detects packing with a KV cache too")
    else:
        _check("flat-sdpa", rows, out.loss, entries, model, corpus)


def test_plain_causal_mask_leaks(corpus):
    """Control: without the document mask the same check fails, so the check has teeth."""
    tokens, offsets, labels = corpus
    model = _model("llama")
    packed = vecpack.pack(tokens, offsets, MAX_LEN, labels=labels, strategy="bfd", long="split")
    plan = packed.plan
    entries = list(zip(plan.doc_index.tolist(), plan.doc_start.tolist(), plan.doc_length.tolist()))
    flex = collate_flex([packed[i] for i in range(len(packed))])
    b, t = flex["input_ids"].shape
    causal = torch.ones(t, t, dtype=torch.bool).tril()[None, None].expand(b, 1, t, t)
    out = _run(model, "sdpa", input_ids=flex["input_ids"], position_ids=flex["position_ids"],
               labels=flex["labels"], attention_mask=causal)  # positions restart, attention does not
    model_rows = [(p, int(a), int(n)) for p in range(len(packed))
                  for a, n in zip(np.cumsum(packed[p]["seq_lens"]) - packed[p]["seq_lens"], packed[p]["seq_lens"])]
    with pytest.raises(AssertionError, match="leaks"):
        _check("causal", [out.logits[p, a:a + n] for p, a, n in model_rows], out.loss, entries, model, corpus)


@pytest.mark.parametrize("path", ["sdpa-4d", "flex", "varlen"])
def test_packed_gradients_equal_solo_gradients(corpus, path):
    """One training step's gradients: summed packed loss == sum of the documents' summed losses."""
    tokens, offsets, labels = corpus
    model = _model("qwen2").train()
    packed = vecpack.pack(tokens, offsets, MAX_LEN, labels=labels, strategy="ffd", long="split")
    packs = [packed[i] for i in range(len(packed))]
    plan = packed.plan

    model.zero_grad()
    for doc, start, length in zip(plan.doc_index.tolist(), plan.doc_start.tolist(), plan.doc_length.tolist()):
        a = int(offsets[doc]) + start
        ids = torch.from_numpy(tokens[a:a + length].astype(np.int64))[None]
        lab = torch.from_numpy(labels[a:a + length].astype(np.int64))[None].clone()
        lab[0, 0] = -100
        n = int((lab[0, 1:] != -100).sum())
        if n:
            (model(input_ids=ids, labels=lab, use_cache=False).loss * n).backward()
    solo = {k: p.grad.clone() for k, p in model.named_parameters()}

    model.zero_grad()
    if path == "varlen":
        batch = collate_flash(packs)
        impl, inputs = "vecpack_varlen_reference", dict(batch)
    else:
        batch = collate_flex(packs, block_size=16)
        mask = block_causal_mask(batch["seq_idx"]) if path == "sdpa-4d" else batch.block_mask
        impl = "sdpa" if path == "sdpa-4d" else "vecpack_flex_eager"
        inputs = dict(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                      labels=batch["labels"], attention_mask=mask)
    n_total = int((torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[:, 1:] != -100).sum())
    model.config._attn_implementation = impl
    try:
        (model(**{"use_cache": False, **inputs}).loss * n_total).backward()
    except NotImplementedError as e:  # torch 2.13: "FlexAttention does not support backward on CPU"
        pytest.skip(f"flex_attention backward unavailable here ({e}); forward parity is tested above")
    finally:
        model.config._attn_implementation = "sdpa"
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, solo[k], atol=1e-4, rtol=1e-4, msg=lambda m, k=k: f"{path} {k}: {m}")


@pytest.mark.slow
def test_transformers_flex_attention_compiled(corpus):
    """transformers' own flex_attention path (torch.compile'd; on CPU inductor's kernel skips
    blocks by the BlockMask's block structure, unlike the eager path) with FlexBatch.block_mask."""
    tokens, offsets, labels = corpus
    model = _model("llama")
    packed = vecpack.pack(tokens, offsets, MAX_LEN, labels=labels, strategy="bfd", long="split")
    plan = packed.plan
    entries = list(zip(plan.doc_index.tolist(), plan.doc_start.tolist(), plan.doc_length.tolist()))
    flex = collate_flex([packed[i] for i in range(len(packed))], block_size=16)
    try:
        out = _run(model, "flex_attention", input_ids=flex["input_ids"], position_ids=flex["position_ids"],
                   labels=flex["labels"], attention_mask=flex.block_mask)
    except Exception as e:  # no C++ compiler / inductor CPU backend on this machine
        pytest.skip(f"compiled flex_attention unavailable on this CPU: {type(e).__name__}: {e}")
    rows = [(p, int(a), int(n)) for p in range(len(packed))
            for a, n in zip(np.cumsum(packed[p]["seq_lens"]) - packed[p]["seq_lens"], packed[p]["seq_lens"])]
    _check("hf-flex", [out.logits[p, a:a + n] for p, a, n in rows], out.loss, entries, model, corpus)
