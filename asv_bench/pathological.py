#!/usr/bin/env python
"""Pathological texts at full size: vecpack's ids against ``apply_chat_template``, and the time against HF.

    python asv_bench/pathological.py            # Qwen2.5 and Llama 3, both fast engines

For each text of :func:`vecpack.testing.pathological_texts` (1M spaces, mixed whitespace,
one letter, digits, base64; 300k CJK; 200k emoji), alone and inside a conversation, it
checks that ``ChatEncoder.encode_messages`` gives the ids of ``apply_chat_template`` and
prints the CPU time of each engine over HF tokenizers' own time on the same rendered text
(the issue's bar: 3x at most). Run it on a quiet machine.
"""

from __future__ import annotations

import time

import numpy as np
import transformers

from vecpack.testing import cached_tokenizer_dir, pathological_conversations, pathological_texts
from vecpack.tokenizing.encoder import ChatEncoder


def cpu(fn, repeat: int = 3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return best, out


def main() -> int:
    worst, failures = 0.0, 0
    texts = pathological_texts()
    for name in ("qwen2.5", "llama3"):
        d = cached_tokenizer_dir(name)
        hf = transformers.AutoTokenizer.from_pretrained(d)
        engines = {b: ChatEncoder.from_tokenizer(d, backend=b) for b in ("fastokens", "tiktoken")}
        print(f"\n{name}: {'text':<22} {'where':<7} {'HF s':>6} " + " ".join(f"{b + ' s':>12} {'x HF':>6}"
                                                                       for b in engines))
        for label, text in texts.items():
            for where, msgs in pathological_conversations(text).items():
                rendered = hf.apply_chat_template(msgs, tokenize=False)
                t_hf, _ = cpu(lambda hf=hf, r=rendered: hf._tokenizer.encode_batch_fast([r], add_special_tokens=False))
                want = np.asarray(hf.apply_chat_template(msgs, tokenize=True)["input_ids"], np.int32)
                cells = []
                for enc in engines.values():
                    t, (tokens, _) = cpu(lambda enc=enc, m=msgs: enc.encode_messages(m))
                    same = np.array_equal(tokens, want)
                    failures += not same
                    worst = max(worst, t / t_hf)
                    cells.append(f"{t:>12.3f} {t / t_hf:>5.2f}x" + ("" if same else " DIFFERENT"))
                print(f"{name}: {label:<22} {where:<7} {t_hf:>6.2f} " + " ".join(cells))
    print(f"\nids equal apply_chat_template: {'yes' if not failures else f'NO ({failures} differ)'}; "
          f"slowest engine/HF ratio {worst:.2f}x (bar: 3x)")
    return 1 if failures or worst > 3 else 0


if __name__ == "__main__":
    raise SystemExit(main())
