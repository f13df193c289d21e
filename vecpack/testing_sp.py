"""Offline SentencePiece-family fixture tokenizers: Mistral v3 (dummy prefix) and a Gemma-like one.

Built from the SentencePiece ``.model`` that ``mistral-common`` ships (read
by a small protobuf reader here: neither ``sentencepiece`` nor ``protobuf``
is needed); nothing is downloaded. Also re-exported by :mod:`vecpack.testing`.
"""

from __future__ import annotations

import json
import os
import pathlib

__all__ = ["GEMMA_CHAT_TEMPLATE", "MISTRAL_SP_CHAT_TEMPLATE", "make_gemma_like_tokenizer",
           "make_mistral_sp_tokenizer", "sp_model_pieces"]


_SP_NORMAL, _SP_UNKNOWN, _SP_CONTROL, _SP_USER, _SP_BYTE = 1, 2, 3, 4, 6  # ModelProto.SentencePiece.Type

# The [INST] template of Mistral v1-v3 (system prompt on the first user turn); no spaces are written
# around contents: each text between two control tokens gets its own dummy-prefix "▁".
MISTRAL_SP_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set system = none %}"
    "{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system is not none %}{{- '[INST]' + system + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST]' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- else %}{{- message['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}"
)

# Gemma's template (system prompt folded into the first user turn, "model" for the assistant).
GEMMA_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set first = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set first = '' %}"
    "{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return out, i


def _proto_fields(buf: bytes):
    """``(field number, wire type, value)`` of one protobuf message (values: int, bytes or raw float bytes)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:  # pragma: no cover - groups are not used by SentencePiece
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, wire, value


def sp_model_pieces(model_file: str | os.PathLike) -> list[tuple[str, float, int]]:
    """``(piece, score, type)`` of every piece of a SentencePiece ``.model`` file, in id order.

    A small reader of the model's protobuf (field 1, the pieces), so the
    fixtures need neither ``sentencepiece`` nor ``protobuf``.
    """
    import struct

    pieces = []
    for field, _, value in _proto_fields(pathlib.Path(model_file).read_bytes()):
        if field != 1:
            continue
        piece, score, kind = "", 0.0, _SP_NORMAL
        for f, _, v in _proto_fields(value):
            if f == 1:
                piece = v.decode("utf-8")
            elif f == 2:
                score = struct.unpack("<f", v)[0]
            elif f == 3:
                kind = v
        pieces.append((piece, score, kind))
    return pieces


def _mistral_model_file() -> pathlib.Path:
    import mistral_common

    return pathlib.Path(mistral_common.__file__).parent / "data" / "mistral_instruct_tokenizer_240323.model.v3"


def _sp_merges(pieces) -> list[tuple[str, str]]:
    """SentencePiece BPE as HF merges: every split of a normal piece into two normal pieces, by its score.

    SentencePiece merges the adjacent pair whose concatenation scores highest; ties (the whitespace
    runs ``"▁" * n``) go to the leftmost pair, which HF's (rank, position) order reproduces when
    longer left parts rank first.
    """
    normal = {p: (s, i) for i, (p, s, k) in enumerate(pieces) if k == _SP_NORMAL}
    ranked = []
    for piece, (score, pid) in normal.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in normal and right in normal:
                ranked.append((-score, -len(left), len(right), pid, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _write_sp(out: pathlib.Path, pieces, merges, normalizer, extra_added: list[str], config: dict) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab = {}
    for i, (p, _, _) in enumerate(pieces):
        vocab.setdefault(p, i)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tk.normalizer = normalizer
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = [p for p, _, k in pieces if k in (_SP_UNKNOWN, _SP_CONTROL)] + extra_added
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for t in specials:
        if t in vocab and tk.token_to_id(t) != vocab[t]:  # pragma: no cover - guards the fixture itself
            raise AssertionError(f"control piece {t!r} moved")
    out.mkdir(parents=True, exist_ok=True)
    tk.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def make_mistral_sp_tokenizer(out_dir: str | os.PathLike) -> pathlib.Path:
    """Write Mistral v3's SentencePiece BPE (32,768 pieces, byte fallback) as an HF tokenizer.

    Built from the ``.model`` file that ``mistral-common`` ships, in
    SentencePiece's own order: the normalizer prepends ``"▁"`` to every text
    between two control tokens, then replaces ``" "`` by ``"▁"`` (the
    ``tokenizer.json`` of Mistral's and Llama 2's repositories); no
    pre-tokenizer. Control pieces (``<s>``, ``[INST]``...) are special tokens.
    """
    from tokenizers import normalizers

    pieces = sp_model_pieces(_mistral_model_file())
    out = pathlib.Path(out_dir)
    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "model_max_length": 32768, "clean_up_tokenization_spaces": False,
              "chat_template": MISTRAL_SP_CHAT_TEMPLATE}
    _write_sp(out, pieces, _sp_merges(pieces), norm, [], config)
    return out


def make_gemma_like_tokenizer(out_dir: str | os.PathLike) -> pathlib.Path:
    """Write a Gemma-like SentencePiece BPE: no dummy prefix, ``"\\n"`` pieces, Gemma's turn tokens.

    Mistral v3's pieces, plus ``"\\n"``, ``"\\n\\n"``, ``"\\t"`` as normal
    pieces (Gemma's vocabulary has them; Mistral's spells them in byte
    tokens), then ``<start_of_turn>`` / ``<end_of_turn>`` as special tokens;
    the normalizer only replaces ``" "`` by ``"▁"`` (Gemma adds no dummy
    prefix), byte fallback, Gemma's chat template.
    """
    from tokenizers import normalizers

    pieces = sp_model_pieces(_mistral_model_file())
    pieces = [*pieces, ("\n", 0.0, _SP_NORMAL), ("\n\n", 0.0, _SP_NORMAL), ("\t", 0.0, _SP_NORMAL)]
    merges = [("\n", "\n"), *_sp_merges(pieces[:-3])]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<end_of_turn>",
              "unk_token": "<unk>", "pad_token": "<unk>", "model_max_length": 8192,
              "clean_up_tokenization_spaces": False, "chat_template": GEMMA_CHAT_TEMPLATE}
    _write_sp(pathlib.Path(out_dir), pieces, merges, normalizers.Replace(" ", "▁"),
              ["<start_of_turn>", "<end_of_turn>"], config)
    return pathlib.Path(out_dir)
