"""A conversation as one document per trained assistant turn (``per_turn=True``): :class:`TurnSink`.

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
from vecpack.tokenizing.sink import ChunkSink
from vecpack.tokenizing.tasks import add_counts

__all__ = ["TurnSink", "turn_conversations"]


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
