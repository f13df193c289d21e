"""Tree-packed rollouts through tiny random Qwen2 and Llama models: every rollout's log-probs as its own forward.

One step's rollouts cover every case of issue 53 at once: groups of 1, 2, 8 and 16, multi-turn
trajectories with 3-5 nested shared prefixes, one-token prompts and completions, a whole group
identical, and a group whose tree is longer than ``max_len`` (split). They are packed once and run
through each model with the tree mask as sdpa's dense bool mask, eager's additive mask and flex
attention's ``BlockMask``; each rollout's per-token log-probs must equal those of its own unpacked
forward within 1e-5, and the GRPO / DAPO / Dr. GRPO losses (and a gradient) those of the unpacked batch.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers import flex_eager_attention  # noqa: E402

from vecpack.integrations.rl import (  # noqa: E402
    padded_logprobs,
    policy_loss,
    rollout_entropy,
    rollout_logprobs,
    rollout_model_inputs,
    to_completions,
    verl_logprobs,
)
from vecpack.packing.tree import pack_rollouts  # noqa: E402

VOCAB = 61
MAX_LEN = 96
transformers.AttentionInterface.register("vecpack_tree_flex", flex_eager_attention)
IMPLS = {"sdpa": "dense", "eager": "additive", "vecpack_tree_flex": "flex"}


def _model(kind: str):
    torch.manual_seed(0 if kind == "qwen2" else 1)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).float().eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).float().eval()


def _step():
    """The step's rollouts: ``(rolls, group_ids, prompt_lens)``; see the module docstring."""
    rng = np.random.default_rng(53)
    rolls, gid, plens = [], [], []

    def add(prompt, completion, g):
        rolls.append(list(prompt) + list(completion))
        gid.append(g)
        plens.append(len(prompt))

    g = 0
    for size in (1, 2, 8, 16):                              # GRPO groups
        prompt = rng.integers(0, VOCAB, rng.integers(3, 12)).tolist()
        for _ in range(size):
            add(prompt, rng.integers(0, VOCAB, rng.integers(1, 6)).tolist(), g)
        g += 1
    for turns in (3, 4, 5):                                 # trajectories: each turn's prefix holds the last
        for _ in range(2):
            prefix = rng.integers(0, VOCAB, 4).tolist()
            for _ in range(turns):
                answer = rng.integers(0, VOCAB, rng.integers(1, 4)).tolist()
                add(prefix, answer, g)
                prefix = prefix + answer + rng.integers(0, VOCAB, 2).tolist()
            g += 1
    for _ in range(4):                                      # one-token prompts, one-token completions
        add([7], rng.integers(0, VOCAB, 1).tolist(), g)
    add([7], [3, 4], g)
    g += 1
    same = rng.integers(0, VOCAB, 6).tolist()
    for _ in range(4):                                      # a whole group identical
        add(same[:4], same[4:], g)
    g += 1
    long_prompt = rng.integers(0, VOCAB, 40).tolist()       # a tree longer than MAX_LEN: split
    for _ in range(8):
        add(long_prompt, rng.integers(0, VOCAB, rng.integers(5, 12)).tolist(), g)
    return rolls, np.array(gid), np.array(plens)


ROLLS, GROUPS, PLENS = _step()
TOKENS = np.concatenate([np.array(r, np.int32) for r in ROLLS])
OFFSETS = np.r_[0, np.cumsum([len(r) for r in ROLLS])].astype(np.int64)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread is quicker than a pool fighting over a shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def pack():
    p = pack_rollouts(TOKENS, OFFSETS, MAX_LEN, group_ids=GROUPS, prompt_lens=PLENS, vocab_size=VOCAB)
    assert p.stats["long_trees"] == 1 and p.stats["stored_tokens"] < 0.6 * TOKENS.size
    return p


def _solo_logits(model, with_grad=False):
    """Each rollout's own forward (sdpa, positions from 0): its ``[n, V]`` logits."""
    model.config._attn_implementation = "sdpa"
    with torch.set_grad_enabled(with_grad):
        return [model(input_ids=torch.tensor(r)[None]).logits[0].float() for r in ROLLS]


def _solo_logprobs(solo):
    """``[N]``, aligned with TOKENS: 0 at each rollout's first token, as :func:`rollout_logprobs`."""
    out = []
    for r, lg in zip(ROLLS, solo):
        ids = torch.tensor(r)
        lp = torch.log_softmax(lg[:-1], -1).gather(1, ids[1:, None])[:, 0]
        out.append(torch.cat([torch.zeros(1), lp]))
    return torch.cat(out)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_logprobs_equal_each_rollouts_own_forward(pack, kind):
    model = _model(kind)
    want = _solo_logprobs(_solo_logits(model))
    assert want.abs().sum() > 0
    for impl, mask in IMPLS.items():
        model.config._attn_implementation = impl
        with torch.no_grad():
            logits = model(**rollout_model_inputs(pack, mask=mask)).logits
        got = rollout_logprobs(logits, pack)
        err = (got - want).abs().max().item()
        assert err < 1e-5, (impl, err)
        if mask == "flex":   # blocks of 16: the block structure (full, partial, empty blocks) is exercised
            with torch.no_grad():
                small = model(**rollout_model_inputs(pack, mask=mask, block_size=16)).logits
            assert (rollout_logprobs(small, pack) - want).abs().max().item() < 1e-5
        # micro-batches of rows add up to the whole
        halves = [slice(0, len(pack) // 2), slice(len(pack) // 2, len(pack))]
        with torch.no_grad():
            parts = sum(rollout_logprobs(model(**rollout_model_inputs(pack, mask=mask, rows=h)).logits, pack, rows=h)
                        for h in halves)
        assert (parts - want).abs().max().item() < 1e-5
    # the control: the same pack under a plain causal mask is not exact, so the test can fail
    model.config._attn_implementation = "sdpa"
    with torch.no_grad():
        inputs = rollout_model_inputs(pack, mask="dense")
        causal = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"]).logits
    assert (rollout_logprobs(causal, pack) - want).abs().max().item() > 1e-2


@pytest.mark.parametrize("block_size", [8, 16, 128])
def test_flex_block_mask_equals_create_block_mask(pack, block_size):
    from torch.nn.attention.flex_attention import create_block_mask

    from vecpack.integrations.rl import tree_attention_mask

    end = torch.from_numpy(pack.end.astype(np.int64))[:, :90]   # 90: a last block cut short
    end = torch.minimum(end, torch.tensor(90))
    ours = tree_attention_mask(end, mask="flex", block_size=block_size)
    theirs = create_block_mask(lambda b, h, q, k: (k <= q) & (q < end[b, k]), end.shape[0], None, 90, 90,
                               BLOCK_SIZE=block_size, device="cpu")
    assert torch.equal(ours.to_dense(), theirs.to_dense())
    assert torch.equal(ours.full_kv_num_blocks, theirs.full_kv_num_blocks)
    assert torch.equal(ours.kv_num_blocks, theirs.kv_num_blocks)
    dense = tree_attention_mask(end, mask="dense")[:, 0]
    i = torch.arange(90)
    assert torch.equal(ours.mask_mod(i.new_zeros(()), 0, i[:, None], i[None, :]), dense[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_logprobs_and_their_gradient_equal_plain_autograd(pack, monkeypatch, dtype):
    from vecpack.integrations import rl

    monkeypatch.setattr(rl, "CHUNK", 5)     # many chunks, a short last one
    torch.manual_seed(3)
    logits = (torch.randn(len(pack), MAX_LEN, VOCAB) * 3).to(dtype).requires_grad_()
    weights = torch.randn(TOKENS.size)
    got = rollout_logprobs(logits, pack, temperature=0.8)
    (got * weights).sum().backward()
    got_grad, logits.grad = logits.grad.clone(), None
    # plain autograd: each token's predictor row, log_softmax in float32, gathered
    pred = np.r_[0, pack.place[:-1]]
    first = OFFSETS[:-1]
    keep = np.ones(TOKENS.size, bool)
    keep[first] = False
    flat = logits.reshape(-1, VOCAB).float() / 0.8
    lp = torch.log_softmax(flat[torch.from_numpy(pred[keep])], -1).gather(
        1, torch.from_numpy(TOKENS[keep].astype(np.int64))[:, None])[:, 0]
    want = torch.zeros(TOKENS.size).index_put((torch.from_numpy(np.flatnonzero(keep)),), lp)
    (want * weights).sum().backward()
    assert (got - want).abs().max() < 1e-5
    rtol = 1e-5 if dtype == torch.float32 else 2.0 ** -8     # bf16: one rounding of the same float32 sum
    assert torch.allclose(got_grad.float(), logits.grad.float(), atol=1e-5, rtol=rtol) and got_grad.dtype == dtype


def test_entropy_and_temperature(pack):
    model = _model("qwen2")
    solo = _solo_logits(model)
    with torch.no_grad():
        logits = model(**rollout_model_inputs(pack, mask="dense")).logits
    got = rollout_entropy(logits, pack, temperature=0.7)
    lp = rollout_logprobs(logits, pack, temperature=0.7)
    for r, lg in enumerate(solo):
        a, b = OFFSETS[r], OFFSETS[r + 1]
        logp = torch.log_softmax(lg[:-1] / 0.7, -1)
        assert (got[a + 1:b] - (-(logp.exp() * logp).sum(-1))).abs().max() < 1e-5
        ids = torch.tensor(ROLLS[r])
        assert (lp[a + 1:b] - logp.gather(1, ids[1:, None])[:, 0]).abs().max() < 1e-5
        assert got[a] == 0 and lp[a] == 0


def _padded(values_per_rollout, width):
    """``[R, width]`` completions, right-padded, from per-rollout ``[n]`` tensors (the TRL / verl layout)."""
    rows, masks = [], []
    for r, v in enumerate(values_per_rollout):
        c = v[PLENS[r]:]
        rows.append(torch.nn.functional.pad(c, (0, width - c.numel())))
        masks.append(torch.arange(width) < c.numel())
    return torch.stack(rows), torch.stack(masks).float()


def test_grpo_dapo_dr_grpo_losses_and_gradient_equal_unpacked(pack):
    model = _model("qwen2")
    width = int(max(len(r) - p for r, p in zip(ROLLS, PLENS)))
    rng = np.random.default_rng(0)
    adv = torch.tensor(rng.normal(size=len(ROLLS)), dtype=torch.float32)
    old = torch.tensor(rng.normal(scale=0.05, size=TOKENS.size), dtype=torch.float32)   # old log-probs offsets
    param = model.model.layers[0].self_attn.q_proj.weight

    def per_token(logp, old_logp, advantage):      # TRL's clipped surrogate, eps 0.2
        ratio = torch.exp(logp - old_logp)
        return -torch.min(ratio * advantage, torch.clamp(ratio, 0.8, 1.2) * advantage)

    # unpacked: TRL's formulas on the padded [R, C] completions
    model.zero_grad()
    solo = _solo_logits(model, with_grad=True)
    lp_solo = _solo_logprobs(solo)
    per_roll = [lp_solo[OFFSETS[r]:OFFSETS[r + 1]] for r in range(len(ROLLS))]
    logp, mask = _padded(per_roll, width)
    old_p, _ = _padded([old[OFFSETS[r]:OFFSETS[r + 1]] + per_roll[r].detach() for r in range(len(ROLLS))], width)
    ptl = per_token(logp, old_p, adv[:, None])
    want = {"grpo": ((ptl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean(),
            "dapo": (ptl * mask).sum() / mask.sum().clamp(min=1.0),
            "dr_grpo": (ptl * mask).sum() / (ptl.size(0) * 16)}
    want["grpo"].backward()
    want_grad = param.grad.clone()

    model.zero_grad()
    model.config._attn_implementation = "sdpa"
    lp = rollout_logprobs(model(**rollout_model_inputs(pack, mask="dense")).logits, pack)
    adv_tok = adv.repeat_interleave(torch.from_numpy(np.diff(OFFSETS)))
    ptl_packed = per_token(lp, old + lp.detach(), adv_tok)
    got = {k: policy_loss(ptl_packed, pack, k, max_completion_length=16) for k in want}
    for k in want:
        assert abs(got[k].item() - want[k].item()) < 1e-6, k
    got["grpo"].backward()
    assert torch.allclose(param.grad, want_grad, atol=1e-6, rtol=1e-4)
    assert want_grad.abs().max() > 1e-4
    # the completion layout round trip: to_completions gives TRL's [R, C] tensors
    got_pad, got_mask = to_completions(lp.detach(), pack, width=width)
    assert (got_pad - logp.detach()).abs().max() < 1e-5 and torch.equal(got_mask.float(), mask)


def _left_padded_batch():
    """A TRL / verl batch: prompts left-padded to P columns, completions right-padded to C."""
    p_w = int(PLENS.max())
    c_w = int(max(len(r) - p for r, p in zip(ROLLS, PLENS)))
    ids = torch.zeros(len(ROLLS), p_w + c_w, dtype=torch.long)
    am = torch.zeros_like(ids)
    for b, (r, p) in enumerate(zip(ROLLS, PLENS)):
        ids[b, p_w - p:p_w] = torch.tensor(r[:p])
        am[b, p_w - p:p_w] = 1
        ids[b, p_w:p_w + len(r) - p] = torch.tensor(r[p:])
        am[b, p_w:p_w + len(r) - p] = 1
    return ids, am, c_w


@pytest.mark.parametrize("mask", ["dense", "flex"])
def test_padded_batch_pass_trl_and_verl_shapes(mask):
    model = _model("llama")
    want = _solo_logprobs(_solo_logits(model))
    ids, am, c_w = _left_padded_batch()
    model.config._attn_implementation = "sdpa" if mask == "dense" else "vecpack_tree_flex"
    with torch.no_grad():
        logps, ents = padded_logprobs(model, ids, am, c_w, max_len=MAX_LEN, mask=mask, batch_size=2,
                                      compute_entropy=True)
        default, _ = padded_logprobs(model, ids, am, c_w, mask=mask, batch_size=3)   # max_len: the largest tree
        ent_v, logps_v = verl_logprobs(model, {"input_ids": ids, "attention_mask": am, "responses": ids[:, -c_w:]},
                                       max_len=MAX_LEN, mask=mask, calculate_entropy=True)
    assert logps.shape == ents.shape == (len(ROLLS), c_w) and torch.equal(logps, logps_v) and torch.equal(ents, ent_v)
    assert (default - logps).abs().max() < 1e-5
    for b, (r, p) in enumerate(zip(ROLLS, PLENS)):
        c = len(r) - p
        assert (logps[b, :c] - want[OFFSETS[b] + p:OFFSETS[b + 1]]).abs().max() < 1e-5
        assert (logps[b, c:] == 0).all()
    with pytest.raises(ValueError, match="row 0 has no prompt token"):
        padded_logprobs(model, ids, torch.cat([torch.zeros_like(am[:, :-c_w]), am[:, -c_w:]], 1), c_w)


@pytest.mark.parametrize("trainer", ["GRPOTrainer", "RLOOTrainer"])
def test_trl_mixin_matches_trls_own_pass(trainer):
    """TreeGRPOMixin's override against TRL 1.16's own ``_get_per_token_logps_and_entropies`` (its fused head)."""
    trl = pytest.importorskip("trl")
    import contextlib
    import types

    from trl.trainer.grpo_trainer import add_fused_lm_head

    from vecpack.integrations.rl import TreeGRPOMixin

    model = _model("qwen2")
    model.config._attn_implementation = "sdpa"
    add_fused_lm_head(model, temperature=0.9, outputs=("log_probs", "entropy"))
    ids, am, c_w = _left_padded_batch()
    accelerator = types.SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True)
    stub = types.SimpleNamespace(accelerator=accelerator, temperature=0.9, tree_mask=None, tree_max_len=MAX_LEN)
    with torch.no_grad():
        theirs, their_ent, _ = getattr(trl, trainer)._get_per_token_logps_and_entropies(stub, model, ids, am, c_w,
                                                                                         compute_entropy=True)
        ours, our_ent, aux = TreeGRPOMixin._get_per_token_logps_and_entropies(stub, model, ids, am, c_w,
                                                                              compute_entropy=True)
    real = am[:, -c_w:].bool()
    assert aux is None and ours.shape == theirs.shape
    # TRL runs the left-padded rows with positions shifted by their padding; rotary attention depends on
    # position differences only, so the two agree to float error
    assert (ours - theirs)[real].abs().max() < 1e-4
    assert (our_ent - their_ent)[real].abs().max() < 1e-4


# ----------------------------------------------------------------------------- the recipes, run


@pytest.mark.slow
def test_trl_grpo_trainer_with_the_mixin_trains_as_trl(qwen_dir, tmp_path):
    """docs/rl.md's TRL recipe: GRPOTrainer with TreeGRPOMixin trains two steps as GRPOTrainer itself does
    (same seed, same completions): its loss, KL, entropy and gradient norm match TRL's own run."""
    pytest.importorskip("trl")
    import datasets
    from trl import GRPOConfig, GRPOTrainer

    import vecpack

    tok = transformers.AutoTokenizer.from_pretrained(qwen_dir)
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "tiny")   # TRL builds its reference from the path
    prompts = datasets.Dataset.from_dict({"prompt": ["The sky is", "Two plus two is", "Name a color:", "Once"]})
    calls = []

    class Tree(vecpack.TreeGRPOMixin, GRPOTrainer):
        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            calls.append(args[1].shape)
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    def run(trainer_class):
        model = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "tiny", attn_implementation="sdpa")
        args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=8, max_steps=2, use_cpu=True, report_to="none", beta=0.04,
                          logging_steps=1, save_strategy="no", bf16=False, seed=0, learning_rate=1e-2)
        def reward(completions, **kwargs):
            return [float(len(c)) for c in completions]

        trainer = trainer_class(model=model, reward_funcs=reward, args=args, train_dataset=prompts,
                                processing_class=tok)
        trainer.train()
        return [h for h in trainer.state.log_history if "grad_norm" in h]

    theirs, ours = run(GRPOTrainer), run(Tree)
    assert len(calls) >= 4 and len(ours) == len(theirs) == 2   # the policy's and the reference's pass, each step
    for a, b in zip(theirs, ours):
        for key in ("loss", "kl", "entropy", "grad_norm", "reward"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-6), key


@pytest.mark.slow
def test_example_grpo_loop_runs():
    """examples/rl_grpo_loop.py: trains, deterministically, with fewer tokens through the model than rollouts."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "rl_grpo_loop.py"
    spec = importlib.util.spec_from_file_location("rl_grpo_loop", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    first = example.main(["--steps", "2", "--prompts", "2", "--group", "4"])
    assert first == example.main(["--steps", "2", "--prompts", "2", "--group", "4"])
    assert all(np.isfinite(h["loss"]) and h["stored_tokens"] < h["rollout_tokens"] for h in first)
