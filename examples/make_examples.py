"""Regenerate the sample data and the small tokenizer that ship in ``examples/``.

Run from the repository root (takes a few seconds, needs no network)::

    python examples/make_examples.py

It writes, deterministically (same bytes on every run with the same Python
minor version and ``tokenizers`` version, which ``generated-with.json`` records
with the files' SHA-256):

* ``examples/sharegpt_sample.jsonl``: 1,000 synthetic ShareGPT conversations
  from :func:`vecpack.testing.make_sharegpt` (Portuguese chat and English
  prose/code, log-normal message lengths), about 0.8 MB.
* ``examples/tokenizer/``: a byte-level BPE tokenizer with 8,000 ranks trained
  on that text with the ``tokenizers`` library, plus the ChatML specials
  ``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>`` and a Qwen-style
  ChatML chat template. Its ids are BPE ranks (256 bytes, then the merges in
  training order), so tiktoken can encode with it: vecpack's tiktoken fast
  path applies, and ``tokenizer.json`` lists every two-piece split of a
  token as a merge, ranked by the token it makes, so HF ``tokenizers`` and
  tiktoken give the same ids.

>>> # python examples/make_examples.py --check   (exit 1 if the files differ)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's vecpack, installed or not

from vecpack.testing import QWEN_PATTERN, bytes_to_unicode, make_sharegpt  # noqa: E402

NUM_ROWS = 1_000
SEED = 0
NUM_RANKS = 8_000
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, as in Qwen2/2.5-Instruct (without the tool-calling branches).
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def make_sample(path: pathlib.Path) -> pathlib.Path:
    """Write the ShareGPT sample (short messages, so the file stays small)."""
    make_sharegpt(path, NUM_ROWS, seed=SEED, median_user=40, median_assistant=100)
    return path


def _texts(sample: pathlib.Path):
    with open(sample, encoding="utf-8") as f:
        for line in f:
            for turn in json.loads(line)["conversations"]:
                yield turn["value"]


def train_ranks(sample: pathlib.Path, num_ranks: int = NUM_RANKS) -> dict[bytes, int]:
    """Train byte-level BPE on the sample's messages; return tiktoken-style ranks.

    Ranks: the 256 single bytes in GPT-2 order, then each merged token in the
    order the trainer learned it (so a token's rank is its id).
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=num_ranks, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tk.train_from_iterator(_texts(sample), trainer=trainer)
    model = json.loads(tk.to_str())["model"]
    u2b = {u: b for b, u in bytes_to_unicode().items()}

    def to_bytes(piece: str) -> bytes:
        return bytes(u2b[c] for c in piece)

    ranks = {bytes([b]): i for i, b in enumerate(bytes_to_unicode())}
    for merge in model["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        token = to_bytes(left) + to_bytes(right)
        if token not in ranks:
            ranks[token] = len(ranks)
    return ranks


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every two-piece split of every token, ordered by the token's rank.

    tiktoken merges the adjacent pair whose concatenation has the lowest
    rank; listing all splits this way makes HF BPE do the same.
    """
    merges = []
    for token, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        splits = sorted((ranks[token[:i]], ranks[token[i:]], token[:i], token[i:])
                        for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks)
        merges.extend((left, right) for _, _, left, right in splits)
    return merges


def write_tokenizer(out: pathlib.Path, ranks: dict[bytes, int]) -> pathlib.Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for ``ranks``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    b2u = bytes_to_unicode()

    def enc(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {enc(b): r for b, r in ranks.items()}
    merges = [(enc(a), enc(b)) for a, b in _merges_from_ranks(ranks)]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    for i, s in enumerate(SPECIALS):
        assert tk.token_to_id(s) == len(ranks) + i, s
    tk.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    return out


def environment() -> dict:
    """What the bytes depend on: the sample text is cut from the standard library of
    this Python version, and the BPE trainer is the ``tokenizers`` library's."""
    import platform

    import tokenizers

    return {"python": ".".join(platform.python_version_tuple()[:2]), "tokenizers": tokenizers.__version__}


def generate(root: pathlib.Path) -> list[pathlib.Path]:
    """Write the sample and the tokenizer under ``root``; return the files."""
    root.mkdir(parents=True, exist_ok=True)
    sample = make_sample(root / "sharegpt_sample.jsonl")
    tok = write_tokenizer(root / "tokenizer", train_ranks(sample))
    files = [sample, tok / "tokenizer.json", tok / "tokenizer_config.json"]
    record = {"generated_with": environment(),
              "sha256": {str(p.relative_to(root)): _digest(p) for p in files}}
    (root / "generated-with.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return files


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=pathlib.Path, default=HERE, help="where to write (default: examples/)")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary directory and compare with --out; exit 1 on a "
                         "difference, 2 if this Python / tokenizers version is not the one recorded")
    args = ap.parse_args(argv)
    if not args.check:
        for path in generate(args.out):
            print(f"wrote {path} ({path.stat().st_size:,} bytes)")
        return 0
    recorded = json.loads((args.out / "generated-with.json").read_text(encoding="utf-8"))["generated_with"]
    if recorded != environment():
        print(f"cannot check: {args.out} was generated with {recorded}, this is {environment()} "
              "(the bytes depend on both)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(pathlib.Path(tmp))
        bad = [p.relative_to(tmp) for p in fresh
               if not (args.out / p.relative_to(tmp)).exists()
               or _digest(p) != _digest(args.out / p.relative_to(tmp))]
    for p in bad:
        print(f"differs: {args.out / p}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
