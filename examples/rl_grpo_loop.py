#!/usr/bin/env python
"""A plain PyTorch GRPO loop whose log-prob passes run on rollouts packed as prefix trees.

Each step samples ``G`` completions of each prompt, packs the step's rollouts with
``vecpack.pack_rollouts`` (every prompt once, its completions branching off it), and
runs the three log-prob passes of GRPO on the packs: the old policy's and the
reference model's (no grad) and the policy's (with grad). The loss is TRL's clipped
surrogate plus ``beta`` times the k3 KL estimate, normalised as TRL's
``loss_type="grpo"`` (``vecpack.policy_loss``). The model is a tiny random Qwen2 and
the reward a toy one (how often the completion says token 7), so it runs on a CPU in
seconds::

    python examples/rl_grpo_loop.py --steps 5

Swap in your model, tokenizer, generation (vLLM, ...) and reward: the packing,
log-prob and loss lines stay as they are.
"""

from __future__ import annotations

import argparse
import copy

import numpy as np
import torch
import transformers

import vecpack

VOCAB, EOS = 64, 0


def tiny_policy(seed: int):
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   eos_token_id=EOS, pad_token_id=EOS)
    model = transformers.Qwen2ForCausalLM(cfg).float()
    model.config._attn_implementation = "sdpa"   # the dense tree mask; "flex_attention" takes mask="flex"
    return model


@torch.no_grad()
def sample(model, prompts, group: int, max_new: int, generator):
    """``group`` completions of each prompt (sampled, cut after EOS): the step's rollouts, group by group."""
    rollouts, group_ids, prompt_lens = [], [], []
    for g, prompt in enumerate(prompts):
        ids = torch.tensor(prompt)[None].repeat(group, 1)
        for _ in range(max_new):   # no KV cache: a tiny model, a short completion
            logits = model(input_ids=ids).logits[:, -1].float()
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            ids = torch.cat([ids, nxt], 1)
        for row in ids.tolist():
            completion = row[len(prompt):]
            if EOS in completion:
                completion = completion[:completion.index(EOS) + 1]
            rollouts.append(np.array(prompt + completion, np.int32))
            group_ids.append(g)
            prompt_lens.append(len(prompt))
    tokens = np.concatenate(rollouts)
    offsets = np.r_[0, np.cumsum([r.size for r in rollouts])]
    return tokens, offsets, np.array(group_ids), np.array(prompt_lens)


def logprobs(model, pack, *, grad: bool):
    """Every rollout token's log-prob under ``model``, from the packed rows (``[N]``, aligned with pack.tokens)."""
    with torch.set_grad_enabled(grad):
        logits = model(**vecpack.rollout_model_inputs(pack, mask="dense")).logits
        return vecpack.rollout_logprobs(logits, pack)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=4, help="prompts a step")
    ap.add_argument("--group", type=int, default=8, help="completions a prompt (G)")
    ap.add_argument("--max-new", type=int, default=12, help="completion tokens at most")
    ap.add_argument("--max-len", type=int, default=256, help="tokens per packed row")
    ap.add_argument("--beta", type=float, default=0.04, help="KL coefficient")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    policy = tiny_policy(a.seed)
    reference = copy.deepcopy(policy).eval()
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    history = []
    for step in range(a.steps):
        prompts = [rng.integers(1, VOCAB, int(rng.integers(4, 16))).tolist() for _ in range(a.prompts)]
        policy.eval()
        tokens, offsets, group_ids, prompt_lens = sample(policy, prompts, a.group, a.max_new, gen)
        pack = vecpack.pack_rollouts(tokens, offsets, a.max_len, group_ids=group_ids, prompt_lens=prompt_lens,
                                     vocab_size=VOCAB)
        mask = torch.tensor(pack.loss_mask)
        lengths = torch.from_numpy(np.diff(offsets))

        # rewards and group-normalised advantages, one per rollout, then per token
        rewards = torch.tensor([float((tokens[o + p:e] == 7).mean()) for o, p, e in
                                zip(offsets[:-1], prompt_lens, offsets[1:])])
        by_group = rewards.view(a.prompts, a.group)
        adv = ((by_group - by_group.mean(1, keepdim=True)) / (by_group.std(1, keepdim=True) + 1e-4)).reshape(-1)
        adv_tok = adv.repeat_interleave(lengths)

        old = logprobs(policy, pack, grad=False)      # the policy that sampled (one update a step: ratio 1)
        ref = logprobs(reference, pack, grad=False)
        policy.train()
        new = logprobs(policy, pack, grad=True)
        ratio = torch.exp(new - old)
        surrogate = -torch.min(ratio * adv_tok, torch.clamp(ratio, 0.8, 1.2) * adv_tok)
        kl = torch.exp(ref - new) - (ref - new) - 1   # k3, per token
        per_token = (surrogate + a.beta * kl) * mask
        loss = vecpack.policy_loss(per_token, pack, "grpo")
        opt.zero_grad()
        loss.backward()
        opt.step()

        history.append({"step": step, "loss": loss.item(), "reward": rewards.mean().item(),
                        "rollout_tokens": pack.stats["rollout_tokens"], "stored_tokens": pack.stats["stored_tokens"],
                        "rows": len(pack)})
        print(f"step {step}: loss {loss.item():+.4f}  reward {rewards.mean().item():.3f}  "
              f"{pack.stats['stored_tokens']}/{pack.stats['rollout_tokens']} tokens through the model, "
              f"{len(pack)} rows")
    return history


if __name__ == "__main__":
    main()
