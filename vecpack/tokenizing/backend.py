"""Which engine encodes a tokenizer's rows: decided here, and only here.

::

    tokenizer.json ── a byte-level BPE whose merges follow its ranks? (spec.tiktoken_spec) ── no ──► HF tokenizers
         │ yes                                                                                 (the reason)
    fastokens installed, ranks 0, 1, 2...? ── yes ──► fastokens   (else tiktoken: the same tables)
         │
    parity check: engine ids == HF tokenizers ids on the probes (awkward and pathological
         │ texts) and the dataset's own rows (beside the tokenizing: HF in its own process,
         │ the engine as the pool's first task)
         ├── same ids ──► the engine; the passed sample is remembered for the rest of the process
         └── differ ────► HF tokenizers: the engine's output is thrown away and the rows
                           tokenized again (a RuntimeWarning says why)

``backend="fastokens"`` or ``"tiktoken"`` asks for that engine and raises
instead of falling back; ``backend="tokenizers"`` skips the question.
:func:`decide` answers it when an encoder is built; :class:`Pending` is the
check of one ``tokenize()`` call. ``stats["backend"]`` and the CLI report say
which engine ran, and :attr:`ChatEncoder.backend_reason` why not a faster one.
"""

from __future__ import annotations

import hashlib

from vecpack._state import memo
from vecpack.options import FAST_ENGINES
from vecpack.tokenizing import parity
from vecpack.tokenizing import pool as _pool
from vecpack.tokenizing.plan import call_engine
from vecpack.tokenizing.runtime import fast_engine, sentencepiece_style

__all__ = ["Pending", "check_now", "decide", "fall_back", "preload"]

_PASSED = memo("passed parity samples", 256)  # digests of samples that passed in this process


def fall_back(encoder, reason: str, *, stacklevel: int = 3):
    """``encoder`` on HF tokenizers because of ``reason`` (warns; raises if tiktoken was required)."""
    return encoder.fallback(reason, stacklevel=stacklevel + 1)


def decide(encoder, texts, *, requested: str = "auto", defer: bool = False):
    """Choose the engine of a freshly configured encoder (on HF tokenizers until decided).

    Args:
        encoder: a :class:`~vecpack.tokenizing.encoder.ChatEncoder`.
        texts: rendered sample rows for the parity check.
        requested: ``"auto"``, ``"fastokens"`` or ``"tiktoken"`` (raise rather
            than fall back), or ``"tokenizers"``.
        defer: leave the parity check to the caller: the encoder comes back on
            its engine with ``pending_check`` set (:func:`vecpack.tokenize`
            overlaps it with the tokenizing, through :class:`Pending`).
    """
    if requested == "tokenizers":
        return encoder
    encoder._strict = requested != "auto"
    engine, reason = fast_engine(encoder.path)
    if requested == "tiktoken" and engine == "fastokens":
        engine = "tiktoken"
        if sentencepiece_style(encoder.path):
            engine, reason = "tokenizers", "tiktoken does not encode SentencePiece-style BPE (fastokens does)"
    elif requested == "fastokens" and engine == "tiktoken":
        engine = "tokenizers"  # fastokens was asked for and cannot run: say why
    if engine == "tokenizers":  # decided without HF tokenizers
        if requested != "auto":
            encoder.backend = requested  # the strict error names what was asked for
        return fall_back(encoder, reason)
    encoder.backend, encoder.backend_reason, encoder._rt = engine, reason, None
    if defer:
        encoder.pending_check = tuple(texts)
        return encoder
    reason = parity.reason(str(encoder.path), texts, engine)
    return fall_back(encoder, reason) if reason else encoder


def check_now(encoder):
    """Run an encoder's deferred parity check here; returns the encoder to use."""
    texts = encoder.pending_check
    if texts is None:
        return encoder
    reason = parity.reason(str(encoder.path), texts, encoder.backend)
    encoder.pending_check = None
    return fall_back(encoder, reason) if reason else encoder


def preload(tokenizer) -> None:
    """Have the parity check's HF process load ``tokenizer`` now (a new encoder will want a check)."""
    path = _pool.tokenizer_dir(tokenizer)
    if path is not None:
        parity.preload(path)


def _serving(encoder) -> str:
    """The engine this process's runtime of ``encoder`` serves with (it encodes here)."""
    try:
        return encoder.runtime.serving
    except Exception:  # noqa: BLE001 - cannot be built: the check says why
        return encoder.backend


def _digest(key, texts) -> bytes:
    """A digest of a parity-check sample and the tokenizer it was checked with."""
    h = hashlib.blake2b(repr(key).encode(), digest_size=16)
    for t in texts:
        b = t.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.digest()


class Pending:
    """The parity check of one call, under way beside its tokenizing.

    ``Pending.start(encoder, texts, key, workers)``; then :meth:`failed` says
    whether to throw the tiktoken output away (``""`` when it stands). A check
    that cannot run counts as failed (HF tokenizers then runs). Nothing to
    check (another engine, no sample, a sample that passed before in this
    process) is a ``Pending`` that never fails.
    """

    def __init__(self, check=None, digest: bytes | None = None, encoder=None):
        self.check, self.digest, self.encoder = check, digest, encoder
        self._reason: str | None = None if check is not None else ""

    @classmethod
    def start(cls, encoder, texts, key, workers: int, share: int = 0, dense: bool = False,
              short: bool = False) -> "Pending":
        if texts is None or getattr(encoder, "backend", None) not in FAST_ENGINES:
            return cls()
        # pool workers serve a fastokens encoder with the engine the call's share and rows call for
        # (plan.call_engine), this process with its own runtime's: a sample that passed with one
        # engine has not passed with another
        serving = encoder.backend
        if encoder.backend == "fastokens":
            serving = call_engine(share, dense, short) if workers > 1 else _serving(encoder)
            if serving == "vecpack":  # built here before the fork (forkpool.prepare): what the workers serve
                serving = _serving(encoder)   # (fastokens where vecpack's BPE does not take the tokenizer)
        digest = _digest((key if key is not None else encoder.path, serving), texts)
        if digest in _PASSED:  # these very rows passed with this tokenizer in this process
            encoder.pending_check = None
            return cls()
        return cls(_pool.start_check(encoder, texts, workers, share, serving), digest, encoder)

    def known(self) -> str:
        """The verdict if it is already known (the engine cannot be built, the check cannot run)."""
        if self._reason is None and self.check.done():
            return self.failed()
        return self._reason or ""

    def failed(self) -> str:
        """Wait for the verdict: ``""`` if tiktoken's output stands, else why not."""
        if self._reason is None:
            try:
                self._reason = self.check.result()
            except Exception as e:  # the check itself failed: do not trust tiktoken
                self._reason = f"the parity check could not run ({type(e).__name__}: {e})"
            if not self._reason:
                self.encoder.pending_check = None
                _PASSED[self.digest] = True
        return self._reason
