"""The parts of a request, one frozen dataclass per stage, each validated once by :mod:`vecpack.options`.

Each field's role (in the cache key, output-neutral, or applied on read) is
declared here, next to the field (:mod:`vecpack.options`).

>>> PackSpec.make(4096, strategy="ffd")
PackSpec(max_len=4096, strategy='ffd', long='truncate', shuffle_seed=0, prefix_sharing=False, pad_to_multiple_of=1, \
pad_id=None, ignore_index=-100)
>>> RunSpec.make(on_error="ignore")
Traceback (most recent call last):
...
ValueError: unknown on_error 'ignore'; on_error must be one of ['raise', 'skip']
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from vecpack.options import (
    check_mix,
    check_n_jobs,
    check_options,
    check_per_turn,
    check_tokenizer_dir,
    neutral,
)
from vecpack.packing.spec import PackSpec

__all__ = ["ChatSpec", "MixSpec", "PackSpec", "RunSpec", "TokenizerSpec"]


@dataclasses.dataclass(frozen=True)
class ChatSpec:
    """How one input's rows become conversations and which tokens are trained.

    Attributes:
        style: the row format (``sharegpt``, ``openai``, ``alpaca``, ``text``, ``preference``).
        column: the column holding the conversation; None: the style's default.
        masking: which tokens carry the loss (``assistant``, ``last``, ``all``).
        chat_template_kwargs: template variables for every row (e.g. ``{"enable_thinking": false}``),
            as canonical JSON text; a row's own ``chat_template_kwargs`` win over them.
        train_reasoning: False keeps each assistant message's reasoning out of the loss.
        per_turn: one document per trained assistant turn, the conversation up to it rendered as its
            final turn (its reasoning kept), packed as one token trie per conversation (:mod:`vecpack.packing.turns`).
    """

    style: str = "sharegpt"
    column: str | None = None
    masking: str = "assistant"
    chat_template_kwargs: str | None = None
    train_reasoning: bool = True
    per_turn: bool = False

    @classmethod
    def make(cls, style: str = "sharegpt", column: str | None = None, masking: str = "assistant",
             chat_template_kwargs: dict | None = None, train_reasoning: bool = True,
             per_turn: bool = False) -> "ChatSpec":
        check_options(style=style, masking=masking)
        if column is not None and not isinstance(column, str):
            raise TypeError(f"column must be a string, got {type(column).__name__}")
        if not isinstance(train_reasoning, bool):
            raise TypeError(f"train_reasoning must be a bool, got {type(train_reasoning).__name__}")
        kwargs = None
        if chat_template_kwargs:
            if not isinstance(chat_template_kwargs, dict):
                raise TypeError(f"chat_template_kwargs must be a dict (template variable -> value), got "
                                f"{type(chat_template_kwargs).__name__}")
            try:
                kwargs = json.dumps(chat_template_kwargs, sort_keys=True, ensure_ascii=False)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"chat_template_kwargs must hold JSON values: {exc}") from None
        if style == "preference" and (kwargs is not None or not train_reasoning):
            raise ValueError("chat_template_kwargs= and train_reasoning= apply to chat rows; a preference pair "
                             "takes its template variables from its own 'chat_template_kwargs' column")
        if not isinstance(per_turn, bool):
            raise TypeError(f"per_turn must be a bool, got {type(per_turn).__name__}")
        if per_turn:
            check_per_turn(style, masking)
        return cls(style, column, masking, kwargs, train_reasoning, per_turn)

    def with_format(self, style: str, column: str | None, masking: str) -> "ChatSpec":
        """This spec with another row format (a mixture's source), validated; the call's template options kept."""
        return ChatSpec.make(style, column, masking, self.template_kwargs(), self.train_reasoning, self.per_turn)

    def template_kwargs(self) -> dict | None:
        """``chat_template_kwargs`` as a dict (None when not given)."""
        return None if self.chat_template_kwargs is None else json.loads(self.chat_template_kwargs)

    def encoder_options(self) -> dict:
        """The chat encoder's keywords for the template options, only those not at their default."""
        out = {}
        if self.chat_template_kwargs is not None:
            out["chat_template_kwargs"] = self.template_kwargs()
        if not self.train_reasoning:
            out["train_reasoning"] = False
        if self.per_turn:
            out["per_turn"] = True
        return out


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """What turns text (and images) into ids: a tokenizer (directory or object), a ready encoder, or a
    vision-language processor directory (:mod:`vecpack.vision`).

    Each is keyed by content (:func:`vecpack.store.hashing.tokenizer_fingerprint`, the processor's
    fingerprint), never by path or identity.
    """

    tokenizer: Any = None
    encoder: Any = None
    processor: Any = None

    @classmethod
    def make(cls, tokenizer=None, encoder=None, processor=None, *, needed: str = "build()") -> "TokenizerSpec":
        if processor is not None:
            if tokenizer is not None or encoder is not None:
                raise ValueError("pass processor= (a vision-language processor directory) or tokenizer= / encoder=, "
                                 "not both: the processor holds the tokenizer and the chat template")
            return cls(None, None, check_tokenizer_dir(processor, "processor"))
        if tokenizer is None and encoder is None:
            raise TypeError(f"{needed}: a tokenizer is required (a local Hugging Face tokenizer directory or a "
                            f"transformers tokenizer), or encoder=")
        if encoder is None:
            check_tokenizer_dir(tokenizer)
        elif not hasattr(encoder, "encode_row"):
            raise TypeError(f"encoder must have an encode_row(row) method, got {type(encoder).__name__}")
        return cls(tokenizer, encoder)

    @property
    def keyed(self):
        """What the tokenizer key hashes: the encoder when one is given, else the tokenizer."""
        return self.encoder if self.encoder is not None else self.tokenizer


#: What ``PackSpec.make``'s ``unit`` packs, in messages.
@dataclasses.dataclass(frozen=True)
class MixSpec:
    """How a mixture's weights share out the output (see ``docs/mixtures.md``)."""

    by: str = "tokens"
    total: int | None = None
    seed: int = 0
    repeat: bool = True

    @classmethod
    def make(cls, by: str = "tokens", total: int | None = None, seed: int = 0, repeat: bool = True) -> "MixSpec":
        m = check_mix(by, total, seed, repeat)
        return cls(m["mix_by"], m["mix_total"], m["mix_seed"], m["mix_repeat"])

    def as_kwargs(self) -> dict:
        """The ``mix_*`` keywords of the mixture planners."""
        return {"mix_by": self.by, "mix_total": self.total, "mix_seed": self.seed, "mix_repeat": self.repeat}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """How the work runs: none of it changes the output, except ``on_error``.

    Attributes:
        on_error: ``raise`` at the first bad row, or ``skip`` (counted) it.
        n_jobs: worker processes (-1: every core).
        progress: show progress bars and a summary.
        executor: ``loky`` (local processes) or ``ray``.
        cache: False tokenizes and packs in memory, touching no cache.
        cache_dir: the cache root (None: ``$VECPACK_CACHE``, else ``~/.cache/vecpack``).
        verify: re-hash the inputs and check the cached arrays' checksums.
        allow_useless: return packs that would train on nothing or on little of the input.
        chunk_bytes: input bytes per task (None: about 16 tasks per worker).
        pixels: documents with images: their pixels preprocessed once into the cache, or ``lazy`` at
            batch time (the same values).
        output: where the packed dataset is also saved (a directory, or an object-store URL; with
            ``executor="ray"`` the nodes write it there themselves: :mod:`vecpack.cluster`).
    """

    on_error: str = "raise"
    n_jobs: int = neutral(-1)
    progress: bool = neutral(True)
    executor: str = neutral("loky")
    cache: bool = neutral(True)
    cache_dir: str | os.PathLike | None = neutral(None)
    verify: bool = neutral(False)
    allow_useless: bool = neutral(False)
    chunk_bytes: int | None = neutral(None)
    output: str | None = neutral(None)
    pixels: str = neutral("cache")

    @classmethod
    def make(cls, *, on_error: str = "raise", executor: str = "loky", n_jobs: int | None = -1,
             **rest) -> "RunSpec":
        """Validated; ``rest``: the other fields, by name (a wrong name is a ``TypeError``)."""
        check_options(on_error=on_error, executor=executor, pixels=rest.get("pixels", "cache"))
        check_n_jobs(n_jobs)
        return cls(on_error=on_error, n_jobs=n_jobs, executor=executor, **rest)
