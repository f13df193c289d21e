"""A vision chat row -> token ids with every image's placeholders expanded, labels, and its images' grids.

The ids equal the processor's ``apply_chat_template(messages, tokenize=True)``
token for token: the template renders one ``<|image_pad|>`` per image, the text
is tokenized (the placeholder is an added token, so the text around it
tokenizes alike whatever its count), and each placeholder id is repeated
``grid.prod() // merge**2`` times, the grid coming from the image's header.

Labels follow the chat rows' rules: ``masking="assistant"`` trains each
assistant turn from the end of its role header to the end-of-turn token that
closes it (found from the template's own renders of the conversation up to that
turn), ``"last"`` the last assistant turn, ``"all"`` every token. Image tokens are never trained (-100).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vecpack.errors import InputError
from vecpack.options import MASKINGS, ON_ERROR, check_choice
from vecpack.vision.images import image_digest, image_size, read_images

__all__ = ["Encoded", "VisionEncoder"]

IGNORE = -100


@dataclass
class Encoded:
    """One row: ``tokens``/``labels`` int32 [L]; per image its ``grids`` int64 [I, 3], ``digests``, ``refs``."""

    tokens: np.ndarray
    labels: np.ndarray
    grids: np.ndarray
    digests: list
    refs: list


class VisionEncoder:
    """Rows -> :class:`Encoded`, by a :class:`~vecpack.vision.processor.VisionProcessor`'s parts.

    Args:
        processor: the loaded processor.
        masking: ``"assistant"`` (each assistant turn), ``"last"`` or ``"all"``.
        column: the messages column (default ``messages`` or ``conversations``).
        on_error: ``"raise"`` at the first bad row, or ``"skip"`` it (counted by the corpus).
    """

    def __init__(self, processor, *, masking: str = "assistant", column: str | None = None,
                 on_error: str = "raise"):
        check_choice(masking, "masking", MASKINGS)
        self.on_error = check_choice(on_error, "on_error", ON_ERROR)
        self.processor = processor
        self.masking = masking
        self.column = column

    def loaded(self) -> VisionEncoder:
        """This encoder with its processor's parts loaded (before worker processes fork from this one)."""
        load = getattr(self.processor, "load", None)
        if load is not None:
            load()
        return self

    @property
    def fingerprint(self) -> str:
        return f"{self.processor.fingerprint}:{self.masking}:{self.column}:{ENCODER_VERSION}"

    def _spans(self, messages: list[dict], text: str) -> list[tuple[int, int]]:
        if self.masking == "all":
            return [(0, len(text))]
        render = self.processor.render
        eot = self.processor.eos_token or ""
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            head = render(messages[:i], add_generation_prompt=True) if i else ""
            upto = text if i + 1 == len(messages) else render(messages[:i + 1])  # the last turn: the whole text
            if not (upto.startswith(head) and text.startswith(upto)):
                raise InputError("the chat template does not render this conversation turn by turn (each turn's "
                                 "text must extend the previous render); use masking='all'")
            end = upto.rfind(eot, len(head)) if eot else -1
            spans.append((len(head), end + len(eot) if end >= 0 else len(upto)))
        return spans[-1:] if self.masking == "last" else spans

    def _labels(self, text: str, spans, offsets: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        starts = offsets[:, 0]
        trained = np.zeros(len(tokens), dtype=bool)
        for lo, hi in spans:
            trained |= (starts >= lo) & (starts < hi)
        return np.where(trained, tokens, IGNORE).astype(np.int32)

    def encode_messages(self, messages: list[dict], grids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Messages with ``{"type": "image"}`` parts and their images' grids -> (int32 tokens, int32 labels)."""
        proc = self.processor
        text = proc.render(messages)
        enc = proc.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        tokens = np.asarray(enc["input_ids"], dtype=np.int32)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        labels = self._labels(text, self._spans(messages, text), offsets, tokens)
        where = np.flatnonzero(tokens == proc.image_token_id)
        if len(where) != len(grids):
            raise InputError(f"the chat template rendered {len(where)} image placeholder(s) for {len(grids)} "
                             "image(s)")
        if not len(where):
            return tokens, labels
        repeat = np.ones(len(tokens), dtype=np.int64)
        repeat[where] = np.prod(grids, axis=1) // (proc.merge * proc.merge)
        labels = labels.copy()
        labels[where] = IGNORE
        return np.repeat(tokens, repeat), np.repeat(labels, repeat)

    def encode_row(self, row: dict, *, base: str = ".") -> Encoded:
        """One row -> :class:`Encoded`; images are read for their headers only (``InputError`` on bad ones)."""
        messages, refs = read_images(row, base=base, column=self.column)
        grids = np.zeros((len(refs), 3), dtype=np.int64)
        digests = []
        for k, ref in enumerate(refs):
            data = ref.read()
            w, h = image_size(ref, data)
            try:
                grids[k] = self.processor.grid(w, h)
            except ValueError as e:
                raise InputError(f"{ref.where}: the processor refuses this {w}x{h} image: {e}") from None
            digests.append(image_digest(data))
        tokens, labels = self.encode_messages(messages, grids)
        return Encoded(tokens, labels, grids, digests, refs)


ENCODER_VERSION = 1
