"""Preference pairs -> ``prompt_ids``, ``chosen_ids``, ``rejected_ids``: token for token TRL's DPO preparation.

TRL 1.16's ``DPOTrainer`` tokenizes a pair as three texts and splits them
where the token ids diverge, not where the texts do::

    P = template(prompt, add_generation_prompt=True)     "...<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n"
    C = template(prompt + chosen)                        "...<|im_start|>assistant\\nYo<|im_end|>\\n"
    R = template(prompt + rejected)
    cut = min(common_prefix(ids(P), ids(C)), common_prefix(ids(P), ids(R)))
    prompt_ids = ids(P)[:cut];  chosen_ids = ids(C)[cut:];  rejected_ids = ids(R)[cut:]

Standard (string) pairs are ``P = prompt``, ``C = prompt + chosen``, ``R =
prompt + rejected``, each answer ending with the tokenizer's eos text
(appended unless it is there), tokenized with the tokenizer's special tokens
(a BOS where the tokenizer adds one). Conversational answers end with what the
template writes after them (``<|im_end|>\\n`` for ChatML).

:class:`PairEncoder` does exactly this on the engines every chat row uses
(fastokens / tiktoken, checked against HF ``tokenizers``; HF itself
otherwise), without tokenizing the prompt three times: the three texts share
their prompt up to its last added token (``<|im_start|>`` of the generation
prompt), after which text tokenizes independently of what precedes it, so the
shared head is encoded once (its system-prompt part once per process) and
only the three short tails after it are encoded apart. A chunk's texts go to
the engine in one call (:meth:`Runtime.encode_many`).

Each pair becomes three documents of the corpus, in order: the prompt
(labels ``-100``), the chosen answer and the rejected answer (labels = the
tokens: the completion mask), so the tokenized corpus is the usual flat
``tokens``, ``labels``, ``offsets`` (``3 * pairs + 1``) and ``row_ids``.

>>> from vecpack.testing import cached_tokenizer_dir
>>> enc = PairEncoder.from_tokenizer(cached_tokenizer_dir("qwen2.5"))
>>> p, c, r = enc.encode_pair({"prompt": [{"role": "user", "content": "What color is the sky?"}],
...     "chosen": [{"role": "assistant", "content": "It is blue."}],
...     "rejected": [{"role": "assistant", "content": "It is green."}]})
>>> len(p), c, r
(35, [2132, 374, 6303, 13, 151645, 198], [2132, 374, 6176, 13, 151645, 198])
"""

from __future__ import annotations

import hashlib
import itertools
import pathlib

import numpy as np

from vecpack.chat.pairs import Pair, common_prefix, read_pair
from vecpack.errors import InputError
from vecpack.options import IGNORE_INDEX
from vecpack.tokenizing.encoder import _MAX_SAMPLE_ROWS, _PREFIX_MAX_CHARS, ChatEncoder
from vecpack.tokenizing.spec import read_dir

__all__ = ["PAIR_FORMAT", "PARTS", "PairEncoder", "PairSink"]

#: Bump when the tokens of a pair change for the same tokenizer (it keys the cache).
PAIR_FORMAT = 1
#: The documents a pair becomes in the corpus, in order.
PARTS = ("prompt", "chosen", "rejected")


class PairEncoder(ChatEncoder):
    """Encode preference rows exactly as TRL's ``DPOTrainer`` prepares them.

    Build it with :meth:`from_tokenizer` (the engine is chosen and checked as
    for chat rows). It pickles as its configuration and rebuilds its engine
    once per process. A tokenizer without a chat template takes standard
    (string) pairs only.

    Attributes:
        eos_text: the tokenizer's eos token, appended to standard answers.
        (and those of :class:`~vecpack.tokenizing.encoder.ChatEncoder`)
    """

    needs_template = False
    pairs = True  # each row is three documents (prompt, chosen, rejected)

    def __init__(self, path, **kwargs):
        super().__init__(path, **kwargs)
        self.eos_text = read_dir(pathlib.Path(self.path))[1].get("eos_token")

    @classmethod
    def from_tokenizer(cls, tokenizer, *, masking: str = "assistant", style: str = "preference",
                       column: str | None = None, sample_rows=None, backend: str = "auto",
                       defer_check: bool = False) -> "PairEncoder":
        """Build a pair encoder (see :meth:`ChatEncoder.from_tokenizer`).

        ``sample_rows`` are preference rows; ``masking``, ``style`` and
        ``column`` are accepted for a uniform call, but a pair's trained
        tokens are its answers' and its columns are found by form.

        Raises:
            ValueError: ``column`` is given (pairs are read by form), or
                ``style`` is not ``"preference"``.
        """
        if style != "preference":
            raise ValueError(f"PairEncoder reads style='preference' rows, got style={style!r}")
        if column is not None:
            raise ValueError("column= does not apply to preference pairs: their columns are recognised by "
                             "form (see vecpack.chat.pairs)")
        return super().from_tokenizer(tokenizer, masking="all", style="preference", sample_rows=sample_rows,
                                      backend=backend, defer_check=defer_check)

    # ------------------------------------------------------------------ self-checks (hooks of from_tokenizer)

    def _conversations(self, rows) -> list[Pair]:
        out = []
        for row in itertools.islice(rows or (), _MAX_SAMPLE_ROWS):
            try:
                out.append(read_pair(row))
            except InputError:
                continue
        return out

    def _verify(self, pairs) -> None:
        if self.template is None:
            return
        prompts, full = [], []
        for pair in pairs:
            if pair.conversational and pair.messages is None:
                prompt = _dicts(pair.prompt)
                prompts.append(prompt)
                full += [prompt + _dicts(pair.chosen), prompt + _dicts(pair.rejected)]
        if full:
            self.template.verify(full)
            self.template.verify(prompts, add_generation_prompt=True)

    def _texts(self, pairs) -> list[str]:
        texts = []
        for pair in pairs:
            try:
                texts += self.pair_texts(pair)[:3]
            except InputError:
                continue
        return texts

    @property
    def fingerprint(self) -> str:
        """The chat fingerprint (tokenizer files, template, options) and :data:`PAIR_FORMAT`."""
        base = ChatEncoder.fingerprint.fget(self)
        return hashlib.sha256(f"{base}:preference:{PAIR_FORMAT}".encode()).hexdigest()

    def __repr__(self) -> str:
        mode = self.template.mode if self.template is not None else "none"
        return f"PairEncoder({self.path!r}, backend={self.backend!r}, template={mode!r})"

    # ------------------------------------------------------------------ texts

    def pair_texts(self, pair: Pair) -> tuple[str, str, str, int]:
        """``(P, C, R, cacheable)``: the three texts TRL tokenizes, and how many leading
        characters of ``P`` hold only template text and the system prompt.

        Raises:
            InputError: the template rejects the conversation, there is no
                template for a conversational pair, or no eos text for a standard one.
        """
        if not pair.conversational:
            eos = self.eos_text
            if eos is None:
                raise InputError("the tokenizer has no eos_token to end a standard pair's answers")
            chosen = pair.chosen if pair.chosen.endswith(eos) else pair.chosen + eos
            rejected = pair.rejected if pair.rejected.endswith(eos) else pair.rejected + eos
            return pair.prompt, pair.prompt + chosen, pair.prompt + rejected, 0
        t = self.template
        if t is None:
            raise InputError(f"tokenizer {self.path!r} has no chat template for a conversational pair")
        if pair.messages is not None:  # extra message keys, tools...: Jinja sees everything
            prompt, chosen, rejected = pair.messages
            kw = pair.template_kwargs
            return (t.render(prompt, add_generation_prompt=True, extra=kw), t.render(prompt + chosen, extra=kw),
                    t.render(prompt + rejected, extra=kw), 0)
        (pr, pc), (cr, cc), (rr, rc) = pair.prompt, pair.chosen, pair.rejected
        try:
            parts, _, n_cache, _ = t.parts_of(pr, pc, add_generation_prompt=True)
            text_c = "".join(t.parts_of(pr + cr, pc + cc)[0])
            text_r = "".join(t.parts_of(pr + rr, pc + rc)[0])
        except (KeyError, TypeError) as e:
            raise InputError(f"malformed message: {e!r}") from None
        cacheable = sum(map(len, parts[:n_cache])) if n_cache else 0
        return "".join(parts), text_c, text_r, cacheable

    # ------------------------------------------------------------------ encoding

    def chunk_sink(self) -> "PairSink":
        """A collector that encodes many pairs at once (every engine has one)."""
        return PairSink(self)

    def encode_row(self, row: dict) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens, labels)`` of one row: prompt, chosen and rejected back to back (see the module docstring)."""
        sink = PairSink(self)
        sink.add(row)
        tokens, labels, _ = sink.finish()
        return tokens, labels

    def encode_pair(self, row: dict) -> tuple[list[int], list[int], list[int]]:
        """TRL's ``(prompt_ids, chosen_ids, rejected_ids)`` of one row.

        Raises:
            InputError: the row is not a usable pair.
        """
        sink = PairSink(self)
        sink.add(row)
        tokens, _, lengths = sink.finish()
        a, b = int(lengths[0]), int(lengths[0] + lengths[1])
        return tokens[:a].tolist(), tokens[a:b].tolist(), tokens[b:].tolist()


def _dicts(turns) -> list[dict]:
    roles, contents = turns
    return [{"role": r, "content": c} for r, c in zip(roles, contents)]


class PairSink:
    """The pairs of one chunk: rendered one by one, encoded in one engine call, split as TRL splits them.

    :meth:`add` reads and renders a row (raising :class:`InputError`, nothing
    kept, when it is unusable) and notes the texts to encode: the part of the
    shared head not cached for the process, then the prompt's, the chosen
    and the rejected tails. :meth:`finish` encodes them all and returns each
    pair as three documents.

    Attributes:
        per_row: documents per row (3: prompt, chosen, rejected).
        trainable: after :meth:`finish`, the answer tokens (labels not -100).
    """

    per_row = 3

    def __init__(self, encoder: PairEncoder):
        self.enc = encoder
        self.rt = encoder.runtime
        self.split = self.rt.special_re is not None  # fast engines: added tokens cut the text
        self.heads: list = []        # per pair: cached head ids (or None)
        self.affixed: list = []      # per pair: whether the tokenizer's special-token affixes apply
        self.texts: list[str] = []   # 4 per pair: head rest, prompt tail, chosen tail, rejected tail
        self.trainable = 0

    def add(self, row) -> None:
        """Take one row. Raises :class:`InputError` (nothing kept) when it is unusable."""
        pair = read_pair(row)
        text_p, text_c, text_r, cacheable = self.enc.pair_texts(pair)
        for name, text in (("prompt", text_p), ("chosen", text_c), ("rejected", text_r)):
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise InputError(f"the {name} text contains a lone surrogate (invalid Unicode)") from None
        head, k0, k = None, 0, 0
        if self.split:
            rt = self.rt
            if text_c.startswith(text_p) and text_r.startswith(text_p):
                shared = len(text_p)
            else:
                shared = min(common_prefix(text_p, text_c), common_prefix(text_p, text_r))
            if 0 < cacheable <= min(shared, _PREFIX_MAX_CHARS):
                key = text_p[:cacheable]
                k0, ids, exact = rt.cache_prefix(key)
                if k0 and exact:
                    head = ids
                else:
                    k0 = 0
            k = k0
            for m in rt.special_re.finditer(text_p, k0, shared):
                k = m.end()
        self.heads.append(head)
        self.affixed.append(not pair.conversational)
        self.texts += (text_p[k0:k], text_p[k:], text_c[k:], text_r[k:])

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(tokens, labels, lengths)``: every pair's prompt, chosen and rejected ids back to back
        (int32), labels ``-100`` on prompts and the tokens on answers, and the 3 lengths of each pair."""
        ids, offsets = self.enc.runtime.encode_many(self.texts)
        n = len(self.heads)
        pre, post = (np.asarray(a, np.int32) for a in self.enc.text_affixes)
        empty = np.zeros(0, np.int32)
        pieces, lengths = [], np.empty(3 * n, np.int64)
        for i in range(n):
            j = 4 * i
            rest, tp, tc, tr = (ids[offsets[j + q]:offsets[j + q + 1]] for q in range(4))
            head = self.heads[i]
            front = [pre] if self.affixed[i] and len(pre) else []
            if head is not None:
                front.append(head)
            front.append(rest)
            if self.affixed[i] and len(post):
                tp, tc, tr = (np.concatenate([x, post]) for x in (tp, tc, tr))
            cut = min(_common_ids(tp, tc), _common_ids(tp, tr))
            prompt_len = sum(map(len, front)) + cut
            pieces += front
            pieces += (tp[:cut], tc[cut:], tr[cut:])
            lengths[3 * i:3 * i + 3] = (prompt_len, len(tc) - cut, len(tr) - cut)
        tokens = np.concatenate(pieces).astype(np.int32, copy=False) if pieces else empty
        answer = np.tile(np.array([False, True, True]), n)
        labels = np.where(np.repeat(answer, lengths), tokens, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False)
        self.trainable = int(lengths[1::3].sum() + lengths[2::3].sum())
        return tokens, labels, lengths


def _common_ids(a: np.ndarray, b: np.ndarray) -> int:
    """Leading ids ``a`` and ``b`` have in common (TRL's ``common_prefix_length``)."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m
