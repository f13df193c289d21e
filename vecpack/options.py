"""Every option list, shared constant and argument validator, in one import-light place.

Each front door (``vecpack.pack``, ``build``, ``tokenize``,
``StreamingPackedDataset``, ``PackedChatDataset``, the CLI) validates its
arguments here, so one bad value gets one exception type and one message
wherever it is passed. This module imports only the standard library.

>>> check_choice("ffd", "strategy", STRATEGIES)
'ffd'
>>> check_choice("best", "strategy", STRATEGIES)
Traceback (most recent call last):
...
ValueError: unknown strategy 'best'; strategy must be one of ['bfd', 'ffd', 'greedy']
>>> check_int(0, "max_len", minimum=1)
Traceback (most recent call last):
...
ValueError: max_len must be >= 1, got 0

What each field of a request does to the output: one rule, read by the cache key and its test.

Every field of a spec (:mod:`vecpack.pipeline.request`) has one of three roles,
stated on the type where the field is declared:

* ``"key"`` (the default): it changes what is stored, so it is in the cache key;
* ``"neutral"``: it changes nothing in the output (``n_jobs``, ``progress``,
  the executor), so it is left out of the key;
* ``"read"``: it changes the output but not what is stored: it is applied when
  the stored arrays are read (``pad_id``, ``ignore_index``).

A new field is in the key unless its declaration says otherwise, so it cannot be
forgotten there.

>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True)
... class Example:
...     max_len: int = 8
...     n_jobs: int = neutral(-1)
...     pad_id: int = read(0)
>>> key_fields(Example(max_len=4))
{'max_len': 4}
>>> role(dataclasses.fields(Example)[1])
'neutral'
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
import os
import pathlib
import re

__all__ = ["CHAT_STYLES", "CONVERSATION_STYLES", "ENGINES", "EXECUTORS", "EXPORT_FORMATS", "FAST_ENGINES",
           "IGNORE_INDEX", "INT32_MAX", "LONG_POLICIES", "MASKINGS", "MAX_CUT_FRACTION", "MIX_BY", "ON_ERROR",
           "PAIR_LONG_POLICIES", "PIXELS", "ROLES", "STRATEGIES", "STREAM_STRATEGIES", "STYLES", "TORCHTUNE_STYLES",
           "VISION_LONG_POLICIES", "WORKER_START_ENV", "WORKER_START_METHODS", "cache_root", "check_choice",
           "check_index", "check_int", "check_max_len", "check_mix", "check_n_jobs", "check_options",
           "check_pad_multiple", "check_seed", "check_tokenizer_dir", "check_weight", "check_weights",
           "cp_pad_multiple", "key_fields", "neutral", "read", "role", "useless_reason", "worker_start_method"]


#: Row formats of chat data (see :mod:`vecpack.chat.formats`).
CHAT_STYLES = ("sharegpt", "openai", "alpaca", "text")
#: Every ``style=`` a front door takes: the chat formats, and preference pairs (:mod:`vecpack.packing.pairs`).
STYLES = (*CHAT_STYLES, "preference")
#: Styles of a list of turns (torchtune's ``conversation_style``).
CONVERSATION_STYLES = ("sharegpt", "openai")
#: Rows as torchtune's message transforms and ``TextCompletionDataset`` read them:
#: ``ShareGPTToMessages``, ``OpenAIToMessages``, ``AlpacaToMessages``,
#: ``InputOutputToMessages`` and raw text (see :mod:`vecpack.torchtune.messages`).
TORCHTUNE_STYLES = (*CONVERSATION_STYLES, "alpaca", "input_output", "text")
#: Which tokens carry the loss (see :mod:`vecpack.chat.template`).
MASKINGS = ("assistant", "last", "all")
#: Packing strategies (see :func:`vecpack.plan`).
STRATEGIES = ("bfd", "ffd", "greedy")
#: What streaming can do without every length up front.
STREAM_STRATEGIES = ("bfd", "greedy")
#: Documents longer than ``max_len``; the position is the numba kernels' code.
LONG_POLICIES = ("truncate", "drop", "split", "error")
#: ``long=`` for preference pairs (a pair is never split; see :mod:`vecpack.packing.pairs`).
PAIR_LONG_POLICIES = ("truncate", "drop", "error")
#: ``long=`` for documents with images (never cut inside an image; see :mod:`vecpack.vision.packed`): the
#: policies of a unit that cannot be split, as for preference pairs.
VISION_LONG_POLICIES = PAIR_LONG_POLICIES
#: ``long=`` for per-turn conversations (``per_turn=True``: a conversation's documents are one unit;
#: ``"truncate"`` keeps its first turns that fit, see :mod:`vecpack.packing.turns`).
TURN_LONG_POLICIES = PAIR_LONG_POLICIES
#: The chat styles ``per_turn=True`` takes (conversations with assistant turns).
PER_TURN_STYLES = CONVERSATION_STYLES
#: When an image's pixels are preprocessed: once, into the cache, or at batch time (see :mod:`vecpack.vision`).
PIXELS = ("cache", "lazy")
#: A row that cannot be read or encoded.
ON_ERROR = ("raise", "skip")
#: Tokenizer engines, fastest first (``backend=`` of ``ChatEncoder.from_tokenizer``; see
#: :mod:`vecpack.tokenizing.runtime`).
ENGINES = ("fastokens", "tiktoken", "tokenizers")
#: The engines that run from tiktoken's tables and need the parity check.
FAST_ENGINES = ENGINES[:2]
#: Where the tokenizing tasks run.
EXECUTORS = ("loky", "ray")
#: How a call's tokenizing workers start: ``auto`` forks them from this process on Linux
#: (they inherit the tokenizer engine, or the dataset of the items path, and every import),
#: else the persistent pool of spawned loky workers runs them (see :mod:`vecpack.tokenizing.exec`).
WORKER_START_METHODS = ("auto", "fork", "spawn")
#: The environment variable that chooses among :data:`WORKER_START_METHODS`
#: (``VECPACK_ITEMS_START``, its earlier name, is read when it is unset).
WORKER_START_ENV = "VECPACK_WORKER_START"
_OLD_WORKER_START_ENV = "VECPACK_ITEMS_START"
#: The attention masks of tree-shaped batches (shared prompts, per-turn tries): flex ``BlockMask`` or dense bool.
ATTENTION_MASKS = ("flex", "dense")
#: ``vecpack export`` formats.
EXPORT_FORMATS = ("parquet", "jsonl", "hf", "megatron")
#: What the weights of a mixture share out (see :mod:`vecpack.mixing`).
MIX_BY = ("tokens", "rows")

#: The share of the tokenized tokens that truncation (or ``long="drop"``) may cut before
#: :func:`vecpack.build` calls its output useless (see :func:`useless_reason`).
MAX_CUT_FRACTION = 0.5

#: Label of tokens that carry no loss (PyTorch's cross-entropy default).
IGNORE_INDEX = -100
INT32_MAX = 2**31 - 1


def cache_root() -> pathlib.Path:
    """vecpack's cache directory: ``$VECPACK_CACHE``, else ``~/.cache/vecpack``."""
    env = os.environ.get("VECPACK_CACHE")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "vecpack"


def worker_start_method() -> str:
    """``$VECPACK_WORKER_START`` (one of :data:`WORKER_START_METHODS`), ``"auto"`` when unset.

    >>> worker_start_method() in WORKER_START_METHODS
    True
    """
    for name in (WORKER_START_ENV, _OLD_WORKER_START_ENV):
        value = os.environ.get(name)
        if value:
            return check_choice(value, name, WORKER_START_METHODS)
    return "auto"


def check_choice(value, name: str, choices, hint: str = "") -> str:
    """``value`` if it is one of ``choices``, else a ``ValueError`` naming them (and ``hint``)."""
    if isinstance(value, str) and value in choices:
        return value
    return _fail(ValueError, f"unknown {name} {value!r}; {name} must be one of {list(choices)}", hint)


def check_int(value, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int``: ``TypeError`` if it is not an integer, ``ValueError`` if out of range."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_index(value, length: int, name: str = "pack index") -> int:
    """``value`` as an index into ``length`` items, negative ones counted from the end.

    >>> check_index(-1, 3)
    2
    """
    i = check_int(value, name)
    j = i + length if i < 0 else i
    if not 0 <= j < length:
        raise IndexError(f"{name} out of range: {i} (len {length})")
    return j


def check_max_len(value, name: str = "max_len", hint: str = "") -> int:
    """Tokens per pack: an integer in ``1..2**31-1`` (``hint``: how to give one, when it is missing)."""
    if value is None:
        return _fail(ValueError, f"{name} is required (tokens per pack, e.g. 4096)", hint)
    return check_int(value, name, minimum=1, maximum=INT32_MAX)


def check_pad_multiple(value, max_len: int | None = None, name: str = "pad_to_multiple_of") -> int:
    """The multiple every document is padded to when planned: an integer >= 1 that divides ``max_len``.

    >>> check_pad_multiple(8, 4096)
    8
    >>> check_pad_multiple(8, 4100)
    Traceback (most recent call last):
    ...
    ValueError: max_len=4100 is not a multiple of pad_to_multiple_of=8: a pack of padded documents could not \
fill it exactly; use max_len=4096 or 4104
    """
    m = check_int(value, name, minimum=1, maximum=INT32_MAX)
    if max_len is not None and max_len % m:
        lo, hi = max_len // m * m, (max_len // m + 1) * m
        use = f"max_len={lo} or {hi}" if lo else f"max_len={hi}"
        raise ValueError(f"max_len={max_len} is not a multiple of {name}={m}: a pack of padded documents could not "
                         f"fill it exactly; use {use}")
    return m


def cp_pad_multiple(cp_size: int = 1, tp_size: int = 1, sequence_parallel: bool = False) -> int:
    """The multiple each document's length must be padded to for context (and sequence) parallelism.

    Transformer Engine's THD attention splits every document into ``2 * cp_size`` equal chunks
    (its zigzag load balancing), so each padded length is a multiple of ``2 * cp_size``; with
    sequence parallelism each rank's tokens are further split over the ``tp_size`` tensor-parallel
    ranks, and Megatron-Bridge pads to ``tp_size * cp_size * 2`` (``tp_size`` alone without CP):
    the ``align_size`` / ``divisible_by`` of its Qwen3-VL and Qwen3-Omni steps. Without sequence
    parallelism ``tp_size`` does not matter.

    >>> cp_pad_multiple(4), cp_pad_multiple(2, 4, sequence_parallel=True), cp_pad_multiple(1, 4, True)
    (8, 16, 4)
    >>> cp_pad_multiple(1)
    1
    """
    cp = check_int(cp_size, "cp_size", minimum=1)
    tp = check_int(tp_size, "tp_size", minimum=1)
    if not isinstance(sequence_parallel, bool):
        raise TypeError(f"sequence_parallel must be a bool, got {type(sequence_parallel).__name__}")
    base = 2 * cp if cp > 1 else 1
    return base * tp if sequence_parallel else base


def check_n_jobs(value, name: str = "n_jobs") -> int | None:
    """Worker processes: a non-zero integer (``-1``: every core, ``-2``: all but one), or None (one).

    >>> check_n_jobs(0)
    Traceback (most recent call last):
    ...
    ValueError: n_jobs must be a non-zero integer (-1 = every core), got 0
    """
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value == 0:
        raise ValueError(f"{name} must be a non-zero integer (-1 = every core), got {value!r}")
    return int(value)


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform has one), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def check_seed(value, name: str = "seed") -> int | None:
    """A seed: an integer >= 0, or ``None``."""
    return None if value is None else check_int(value, name, minimum=0, maximum=2**64 - 1)


#: ``check_options`` keyword -> (the name messages use, the choices).
_CHOICES = {
    "style": ("style", STYLES),
    "masking": ("masking", MASKINGS),
    "strategy": ("strategy", STRATEGIES),
    "long": ("long policy", LONG_POLICIES),
    "pair_long": ("long policy for preference pairs", PAIR_LONG_POLICIES),
    "vision_long": ("long policy for documents with images", VISION_LONG_POLICIES),
    "turn_long": ("long policy for per-turn conversations", TURN_LONG_POLICIES),
    "pixels": ("pixels", PIXELS),
    "on_error": ("on_error", ON_ERROR),
    "executor": ("backend", EXECUTORS),
}


def check_per_turn(style: str, masking: str) -> None:
    """Raise ``ValueError`` unless ``per_turn=True`` applies to rows of this ``style`` and ``masking``.

    >>> check_per_turn("preference", "assistant")
    Traceback (most recent call last):
    ...
    ValueError: per_turn=True takes conversations (style 'sharegpt' or 'openai'), not style='preference'
    """
    if style not in PER_TURN_STYLES:
        raise ValueError(f"per_turn=True takes conversations (style {' or '.join(map(repr, PER_TURN_STYLES))}), "
                         f"not style={style!r}")
    if masking != "assistant":
        raise ValueError(f"per_turn=True trains each assistant turn in its own document: it needs "
                         f"masking='assistant', not {masking!r}")


def check_per_turn_call(*, door: str, streaming: bool = False, mixture: bool = False, cluster: bool = False,
                        images: bool = False, packs: bool = True, encoder: bool = False) -> None:
    """Raise ``ValueError`` where ``per_turn=True`` is not supported: it says where it is.

    >>> try:
    ...     check_per_turn_call(door="build()", mixture=True)
    ... except ValueError as e:
    ...     print(str(e)[:60])
    build(): per_turn=True is not supported for a mixture yet; b
    """
    for flag, what in ((streaming, "streaming"), (mixture, "a mixture"), (cluster, "a Ray cluster build (output=)"),
                       (images, "documents with images"), (not packs, "a call that does not pack"),
                       (encoder, "an encoder= of your own (its rows are its own)")):
        if flag:
            raise ValueError(f"{door}: per_turn=True is not supported for {what} yet; build one input with "
                             f"vecpack.build(path, tokenizer, max_len, per_turn=True)")


def check_options(**options) -> dict:
    """Validate the named options a front door takes; returns them normalised.

    Keywords: ``style``, ``masking``, ``strategy``, ``long``, ``on_error``,
    ``executor`` (the ``backend=`` of :func:`vecpack.tokenize`),
    ``max_len``, ``seed`` / ``shuffle_seed``. ``None`` values of the choices
    are left alone (the caller's default applies).

    >>> check_options(style="openai", max_len=4096)
    {'style': 'openai', 'max_len': 4096}
    """
    out = {}
    for key, value in options.items():
        if key in _CHOICES:
            name, choices = _CHOICES[key]
            out[key] = value if value is None else check_choice(value, name, choices)
        elif key == "max_len":
            out[key] = check_max_len(value)
        elif key in ("seed", "shuffle_seed"):
            out[key] = check_seed(value, key)
        else:
            raise TypeError(f"check_options() got an unknown option {key!r}")
    return out


def _fail(kind, message: str, hint: str):
    raise kind(f"{message} ({hint})" if hint else message)


def useless_reason(stats: dict, *, rows: int | None = None, rejected: int = 0, masking: str | None = None) -> str:
    """Why a build's packs would train on nothing or on little of the input; ``""`` if they would not.

    ``stats`` is a plan's (``num_packs``, ``num_documents``, ``input_tokens``,
    ``truncated`` / ``truncated_tokens``, ``dropped`` / ``dropped_tokens``,
    ``max_len``, ``long``, and ``trained_tokens`` when known); ``rows`` and
    ``rejected`` are the tokenizer's counts. The reason names what to change.

    >>> useless_reason({"num_packs": 0, "num_documents": 0}, rows=0)
    '0 packs: the input has no rows'
    >>> useless_reason({"num_packs": 3, "num_documents": 9, "input_tokens": 900, "truncated": 8,
    ...                 "truncated_tokens": 600, "max_len": 32, "long": "truncate"})[:60]
    '67% of the 900 tokenized tokens were cut: 8 of 9 documents a'
    """
    max_len, long = stats.get("max_len"), stats.get("long", "truncate")
    longer = "raise max_len or use long='split' (--max-len, --long split)"
    if not stats.get("num_packs"):
        if rows == 0:
            return "0 packs: the input has no rows"
        if rows and rejected >= rows:
            return f"0 packs: every one of the {rows:,} rows was rejected (on_error='skip'; see the examples)"
        if stats.get("dropped") and stats.get("dropped") == stats.get("num_documents"):
            return (f"0 packs: every document is longer than max_len={max_len} and long='drop' dropped "
                    f"them all; {longer}")
        return "0 packs: every document has 0 tokens"
    trained = stats.get("trained_tokens")
    if trained == 0:
        if stats.get("truncated"):
            return (f"0 trained tokens: truncation at max_len={max_len} cut every token that carries a loss "
                    f"({stats['truncated']:,} of {stats.get('num_documents', 0):,} documents truncated); {longer}")
        return (f"0 trained tokens: no token carries a loss with masking={masking!r} (no assistant turn to "
                "train on?); use masking='all' (--masking all) to train on every token")
    cut = stats.get("truncated_tokens", 0) + stats.get("dropped_tokens", 0)
    total = stats.get("input_tokens") or 0
    if total and cut > MAX_CUT_FRACTION * total:
        n = stats.get("truncated") or stats.get("dropped") or 0
        return (f"{100 * cut / total:.0f}% of the {total:,} tokenized tokens were cut: {n:,} of "
                f"{stats.get('num_documents', 0):,} documents are longer than max_len={max_len} "
                f"(long={long!r}); {longer}")
    return ""


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def check_tokenizer_dir(value, name: str = "tokenizer"):
    """``value`` unless it is a path that does not exist: then a ``FileNotFoundError`` saying what to do.

    A Hugging Face Hub model name (``Qwen/Qwen2.5-7B-Instruct``) gets the
    commands that fetch its tokenizer files: vecpack never downloads.

    >>> check_tokenizer_dir("Qwen/Qwen2.5-7B-Instruct")
    Traceback (most recent call last):
    ...
    FileNotFoundError: tokenizer 'Qwen/Qwen2.5-7B-Instruct': no such directory. It looks like a Hugging Face \
Hub model name, and vecpack never downloads: fetch the tokenizer files first, e.g. `huggingface-cli download \
Qwen/Qwen2.5-7B-Instruct tokenizer.json tokenizer_config.json --local-dir Qwen2.5-7B-Instruct` (or \
AutoTokenizer.from_pretrained('Qwen/Qwen2.5-7B-Instruct').save_pretrained('Qwen2.5-7B-Instruct')), then pass \
that directory
    """
    if not isinstance(value, (str, os.PathLike)) or os.path.exists(value):
        return value
    text = os.fspath(value)
    message = f"{name} {text!r}: no such directory"
    if _HUB_ID.fullmatch(text) and not text.startswith((".", "~")):
        local = text.rsplit("/", 1)[1]
        message += (f". It looks like a Hugging Face Hub model name, and vecpack never downloads: fetch the "
                    f"tokenizer files first, e.g. `huggingface-cli download {text} tokenizer.json "
                    f"tokenizer_config.json --local-dir {local}` (or AutoTokenizer.from_pretrained({text!r})"
                    f".save_pretrained({local!r})), then pass that directory")
    raise FileNotFoundError(message)


# --------------------------------------------------------------------------- mixtures


def check_weight(value, name: str = "weight") -> float:
    """One source's weight: a finite number >= 0 (``name`` says whose, in messages)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"weight of {name} must be a number, got {type(value).__name__}")
    w = float(value)
    if w != w or w in (float("inf"), float("-inf")):
        raise ValueError(f"weight of {name} is {w}; a weight must be a finite number >= 0")
    if w < 0:
        raise ValueError(f"weight of {name} is {w:g}; a weight must be >= 0")
    return w


def check_weights(weights, names) -> list[float]:
    """The weights of a mixture's sources, normalised to sum to 1.

    Args:
        weights: one number per source (>= 0, finite, not all zero).
        names: how each source is named in messages (``"source 2 ('b.jsonl')"``).

    Raises:
        ValueError: a count that does not match the sources, a negative,
            NaN or infinite weight (naming the source), or all zero.
        TypeError: a weight that is not a number.

    >>> check_weights([3, 1], ["source 1", "source 2"])
    [0.75, 0.25]
    >>> check_weights([0.5, -1], ["source 1 ('a.jsonl')", "source 2 ('b.jsonl')"])
    Traceback (most recent call last):
    ...
    ValueError: weight of source 2 ('b.jsonl') is -1; a weight must be >= 0
    """
    names = list(names)
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise TypeError(f"weights must be a list of numbers, one per source, got {type(weights).__name__}")
    weights = list(weights)
    if len(weights) != len(names):
        raise ValueError(f"{len(weights)} weights for {len(names)} sources; give one weight per source "
                         f"({', '.join(names)})")
    out = [check_weight(w, name) for w, name in zip(weights, names)]
    total = sum(out)
    if total <= 0:
        raise ValueError(f"every weight is zero ({', '.join(names)}); give at least one source a weight > 0")
    return [w / total for w in out]


def check_mix(mix_by="tokens", mix_total=None, mix_seed=0, mix_repeat=True) -> dict:
    """Validate the mixing options of ``vecpack.build`` / streaming; returns them normalised.

    ``mix_total`` is ``None`` (as large as possible without repeating a
    document) or a number of tokens or rows (by ``mix_by``) >= 1.

    >>> check_mix("rows", 1000)
    {'mix_by': 'rows', 'mix_total': 1000, 'mix_seed': 0, 'mix_repeat': True}
    """
    if not isinstance(mix_repeat, bool):
        raise TypeError(f"mix_repeat must be a bool, got {type(mix_repeat).__name__}")
    return {"mix_by": check_choice(mix_by, "mix_by", MIX_BY),
            "mix_total": None if mix_total is None else check_int(mix_total, "mix_total", minimum=1),
            "mix_seed": check_int(mix_seed, "mix_seed", minimum=0, maximum=2**64 - 1),
            "mix_repeat": mix_repeat}


#: The roles a field can have (see the module's docstring).
ROLES = ("key", "neutral", "read")


def neutral(default=None, **kw):
    """A field that does not change the output (it stays out of the cache key)."""
    return dataclasses.field(default=default, metadata={"role": "neutral"}, **kw)


def read(default=None, **kw):
    """A field applied when stored arrays are read: it changes the output, not the stored entries."""
    return dataclasses.field(default=default, metadata={"role": "read"}, **kw)


def role(f: dataclasses.Field) -> str:
    """The role of a dataclass field: ``"key"`` unless declared otherwise."""
    return f.metadata.get("role", "key")


def key_fields(spec) -> dict:
    """The fields of ``spec`` that are in the cache key, by name, in declaration order."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if role(f) == "key"}
