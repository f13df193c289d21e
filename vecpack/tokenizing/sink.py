"""The rows of one chunk, encoded with the fast engine and labelled in one pass (:class:`ChunkSink`, :class:`TurnSink`).

:class:`~vecpack.tokenizing.encoder.ChatEncoder` hands its rows here when an
engine other than HF tokenizers runs: each row's rendered pieces are kept
(references only), every text of the chunk is encoded in one call, cached
prefixes are spliced in front of the rows that start with them, and the whole
chunk is labelled at once.

**Per turn.** A conversation as one document per trained assistant turn (``per_turn=True``): :class:`TurnSink`.

Templates such as Qwen3's render an assistant turn's reasoning only when the
turn comes after the last user message, so in an ordinary multi-turn row the
earlier turns are trained without the reasoning the model wrote at
inference. Per turn, each trained assistant message ``t_i`` gets its own
document: the template's rendering of ``messages[:t_i + 1]`` (the turn as
the final one, exactly ``apply_chat_template(messages[:t_i + 1], tools=...,
**chat_template_kwargs)``), in which only that turn is trained. The spans
are the ordinary ones (:func:`vecpack.chat.spans.conversation_parts`), with
every other assistant message marked untrained.

>>> from vecpack.chat.conversation import read_conversation
>>> conv = read_conversation({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
...     {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}, "openai")
>>> [(len(c.messages), sorted(c.untrained)) for c in turn_conversations(conv)]
[(2, []), (4, [1])]
"""

from __future__ import annotations

import numpy as np

from vecpack.chat.conversation import Conversation, TextCompletion, read_row
from vecpack.errors import InputError
from vecpack.tokenizing.lane import splice_heads
from vecpack.tokenizing.tasks import add_counts
from vecpack.tokenizing.tokenized import part_sizes

__all__ = ["ChunkSink", "TurnSink", "turn_conversations"]


_PREFIX_MAX_CHARS = 32_768      # longer prefixes are not cached


class ChunkSink:
    """The rows of one chunk, encoded with the fast engine and labelled in one pass.

    Per row, :meth:`add` renders the conversation and keeps its text and the
    UTF-8 size and trainability of each piece (added to two flat lists of ints and bools, which the
    garbage collector never walks, as it would a list a row). A prefix holding only template text and
    the system prompt (the same in many rows) is tokenized once per process,
    and its ids are spliced in front of the rows that start with it, all rows
    at once. With fastokens every row's text is encoded in one
    ``encode_batch_flat`` call at :meth:`finish`; with tiktoken, row by row as
    it comes. :meth:`finish` labels the whole chunk with
    :meth:`~vecpack.tokenizing.runtime.Runtime.labels`. A row the fast engine
    cannot take exactly (see :meth:`~vecpack.tokenizing.runtime.Runtime.exact`)
    is encoded by HF tokenizers on its own and slotted in at its place.
    """

    def __init__(self, encoder):
        self.enc = encoder
        self.rt = encoder.runtime
        self.heads: list = []            # fast rows: cached prefix ids (or None)
        self.texts: list[str] = []       # fast rows: the text after the prefix (batch engines)
        self.ids: list[np.ndarray] = []  # fast rows: its ids (engines that encode text by text)
        self.sizes: list = []            # fast rows: the UTF-8 size of each piece, row after row
        self.train: list = []            # fast rows: whether each piece is trained, row after row
        self.slow: dict[int, tuple] = {}  # row index -> (tokens, labels) of a row HF encoded
        self.rows = 0
        self.counts: dict[str, int] = {}  # agentic rows' tool calls, results, reasoning (spans.conversation_parts)

    def add(self, row) -> None:
        """Take one row. Raises :class:`InputError` (nothing kept) when it is unusable."""
        enc = self.enc
        got = read_row(row, enc.style, enc.column)
        if type(got) is TextCompletion:  # TRL's plain-text prompt-completion: tokens of its own
            self.slow[self.rows] = enc.encode_completion(got)
            self.rows += 1
            return
        if type(got) is not tuple:  # tools, calls, reasoning...: rendered by Jinja, its spans found
            parts, train, info = enc.template.conversation_parts(got)
            self.add_parts(parts, train, 0, None)
            add_counts(self.counts, info)
            return
        try:
            rendered = enc.template.parts_of(*got)
        except (KeyError, TypeError) as e:
            raise InputError(f"malformed message: {e!r}") from None
        self.add_parts(*rendered)

    def add_parts(self, parts, train, n_cache, layout) -> None:
        """Take one rendered row: ``template.parts(...)``'s output."""
        rt = self.rt
        text = rest = "".join(parts)
        try:
            sizes = part_sizes(parts, layout, text)
        except UnicodeEncodeError:
            raise InputError("text contains a lone surrogate (invalid Unicode)") from None
        head, exact = None, None
        if n_cache:
            c = sum(map(len, parts[:n_cache])) if n_cache > 1 else len(parts[0])
            if 0 < c <= _PREFIX_MAX_CHARS:
                key = text[:c]
                k, ids, prefix_exact = rt.cache_prefix(key)
                if k:
                    head, rest = ids, text[k:]
                    # an exact prefix and an exact rest that starts with an ASCII character make an exact
                    # whole (nothing composes or reorders across that boundary): the prefix is not re-scanned
                    if prefix_exact and rest[:1].isascii():
                        exact = rt.exact(rest)
        if not (rt.exact(text) if exact is None else exact):
            self.slow[self.rows] = self.enc._encode_tokenizers(parts, train)
            self.rows += 1
            return
        if rt.batch:
            self.texts.append(rest)
        else:
            self.ids.append(rt.encode(rest, rt.allowed if layout is None else self.enc._allowed(layout, parts)))
        self.heads.append(head)
        self.sizes += sizes
        self.train += train
        self.rows += 1

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(tokens, labels, lengths)``: every row added, back to back (int32), and each row's length.

        ``self.trainable`` is then the number of trained tokens.
        """
        rt = self.rt
        if rt.batch:
            ids, offsets = rt.encode_batch(self.texts) if self.texts else (np.zeros(0, np.int32),
                                                                           np.zeros(1, np.int64))
            lengths = np.diff(offsets)
        else:
            lengths = np.fromiter(map(len, self.ids), np.int64, len(self.ids))
            ids = np.concatenate(self.ids) if self.ids else np.zeros(0, np.int32)
        ids, lengths = _with_heads(ids, lengths, self.heads)
        sizes = np.fromiter(self.sizes, np.int64, len(self.sizes))
        train = np.fromiter(self.train, np.int8, len(self.train))
        done = rt.labels(ids, lengths, sizes, train, masking_all=self.enc.masking == "all",
                         empty_runs=getattr(self.enc.template, "has_generation", False))  # (empty blocks)
        if done is None:  # pragma: no cover - the engine's tokens do not spell the text
            raise RuntimeError(f"the tokens of a chunk cover other bytes than its text's {int(sizes.sum())}")
        labels, self.trainable = done
        if not self.slow:
            return ids, labels, lengths
        return self._with_slow_rows(ids, labels, lengths)

    def _with_slow_rows(self, ids, labels, lengths):
        """Slot the rows HF encoded in between the fast ones, at their places."""
        toks, labs, lens = [], [], []
        fast_at = np.concatenate([[0], np.cumsum(lengths)])
        j = 0
        for i in range(self.rows):
            if i in self.slow:
                t, lab = self.slow[i]
                self.trainable += int(np.count_nonzero(lab != -100))
            else:
                t, lab = ids[fast_at[j]:fast_at[j + 1]], labels[fast_at[j]:fast_at[j + 1]]
                j += 1
            toks.append(t)
            labs.append(lab)
            lens.append(len(t))
        return (np.concatenate(toks).astype(np.int32, copy=False), np.concatenate(labs).astype(np.int32, copy=False),
                np.asarray(lens, np.int64))


def _with_heads(ids: np.ndarray, lengths: np.ndarray, heads: list) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, lengths)`` with each row's cached prefix ids (``heads[i]``, or ``None``) in front of it.

    ``ids`` holds the rows' other tokens back to back, ``lengths[i]`` row i's
    count of them.

    >>> ids, lengths = _with_heads(np.array([7, 8, 9], np.int32), np.array([1, 2]),
    ...                            [np.array([1, 2], np.int32), None])
    >>> ids.tolist(), lengths.tolist()
    ([1, 2, 7, 8, 9], [3, 2])
    """
    keys = np.fromiter(map(id, heads), np.int64, len(heads))
    if not len(keys) or (keys == id(None)).all():
        return ids, lengths
    distinct, head_of = np.unique(keys, return_inverse=True)
    by_id = {id(h): h for h in heads if h is not None}
    table = [by_id.get(key) for key in distinct.tolist()]
    head_of = head_of.reshape(-1).astype(np.int64)
    none = next((d for d, h in enumerate(table) if h is None), -1)
    if none >= 0:  # rows without a prefix: index -1
        head_of[head_of == none] = -1
    return splice_heads(ids, lengths, head_of, table)


def turn_conversations(conv: Conversation) -> list[Conversation]:
    """One conversation per trained assistant message: the messages up to it, only it trained.

    A prompt-completion row's trained turns are the assistant messages of its
    completion. A conversation with no trained assistant message stays whole (one document).
    """
    msgs = conv.messages
    first = conv.prompt_len or 0
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and i >= first and i not in conv.untrained]
    if not turns:
        return [conv]
    assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    return [Conversation(msgs[:t + 1], conv.kwargs, [i for i in assistants if i < t], None, conv.counts)
            for t in turns]


class TurnSink(ChunkSink):
    """A :class:`~vecpack.tokenizing.sink.ChunkSink` that turns each row into its per-turn documents.

    Attributes:
        row_docs: the documents of each row added (the row loop repeats the
            row's index for each, :func:`vecpack.tokenizing.rows.encode_rows`).
    """

    def __init__(self, encoder):
        super().__init__(encoder)
        self.row_docs: list[int] = []

    def add(self, row) -> None:
        """Take one row. Raises :class:`InputError` (nothing kept) when it is unusable."""
        enc = self.enc
        got = read_row(row, enc.style, enc.column)
        if type(got) is TextCompletion:  # plain text: one document, as ever
            super().add(row)
            self.row_docs.append(1)
            return
        if type(got) is tuple:
            got = Conversation([{"role": r, "content": c} for r, c in zip(*got)])
        convs = turn_conversations(got)
        docs = [enc.template.conversation_parts(c) for c in convs]
        for parts, _, _ in docs:  # every document checked before any is kept
            try:
                "".join(parts).encode("utf-8")
            except UnicodeEncodeError:
                raise InputError("text contains a lone surrogate (invalid Unicode)") from None
        for parts, train, _ in docs:
            if enc.backend == "tokenizers":
                self.slow[self.rows] = enc._encode_tokenizers(parts, train)
                self.rows += 1
            else:
                self.add_parts(parts, train, 0, None)
        info = dict(got.counts)
        # a trace is dropped when its own document (where its turn is the final one) does not render it
        info["reasoning_dropped"] = sum(1 for c, (parts, _, _) in zip(convs, docs)
                                        if (c.messages[-1].get("reasoning_content") or "").strip()
                                        not in "".join(parts))
        add_counts(self.counts, info)
        self.row_docs.append(len(docs))

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :meth:`ChunkSink.finish`, one entry per document."""
        if not self.heads:  # every document encoded by HF tokenizers (or none)
            self.trainable = 0
            empty = np.zeros(0, np.int32)
            return self._with_slow_rows(empty, empty, np.zeros(0, np.int64)) if self.rows else \
                (empty, empty, np.zeros(0, np.int64))
        return super().finish()
