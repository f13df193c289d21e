"""Content fingerprints of what a corpus depends on: the data, the tokenizer, the options.

Keys hold content hashes only (no paths), so moving the data or the tokenizer
keeps the key, and a one-byte edit changes it. File digests go through the
cache's stat memo (:func:`vecpack.store.hashing.file_digests`).

>>> from vecpack.testing import cached_tokenizer_dir
>>> tokenizer_fingerprint(cached_tokenizer_dir("qwen2.5")).startswith("dir:")
True
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from vecpack.options import check_tokenizer_dir
from vecpack.store import hashing

__all__ = ["CORPUS_FORMAT", "data_fingerprint", "describe", "tokenizer_fingerprint"]

#: Bump when tokenization output changes for the same inputs (template
#: rendering, masking rules, encoders): every cached corpus is then rebuilt.
CORPUS_FORMAT = 1


# Files of a Hugging Face tokenizer directory that can change its output.
# Model weights (often in the same directory) are deliberately not read.
_TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json", "tekken.json",
    "config.json",
})
_TOKENIZER_SUFFIXES = (".tiktoken",)


def _hash_arrow_table(table) -> str:
    """Content hash of an in-memory Arrow table, streamed through IPC (no full copy)."""
    import pyarrow as pa

    h = hashlib.blake2b(digest_size=16)

    class _Sink:  # a write-only file that feeds the hash
        closed = False

        def write(self, b):
            h.update(b)
            return len(b)

        def flush(self):
            pass

    with pa.ipc.new_stream(pa.PythonFile(_Sink(), mode="w"), table.schema) as w:
        for batch in table.to_batches(max_chunksize=1 << 16):
            w.write_batch(batch)
    return f"arrow-blake2b_128:{h.hexdigest()}"


def data_fingerprint(files, root: pathlib.Path, verify: bool, on_read=None) -> tuple[list, list[str]]:
    """(key part, readable names) of resolved input files (:class:`~vecpack.inputs.sources.InputFile`):
    content hashes, in order (``on_read``: as :func:`~vecpack.store.hashing.file_digests`)."""
    if any(s.kind == "items" for s in files):
        raise TypeError("the items of an in-memory dataset have no content fingerprint; build them "
                        "with cache=False")
    digests = iter(hashing.file_digests([s.name for s in files if s.kind != "dataset"], verify=verify, root=root,
                                        on_read=on_read))
    parts, names = [], []
    for src in files:
        digest = _hash_arrow_table(src.table) if src.kind == "dataset" else next(digests)
        parts.append({"kind": src.kind, "content": digest})
        names.append(src.name)
    return parts, names


def _is_tokenizer_file(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return (name in _TOKENIZER_FILES or name.endswith(_TOKENIZER_SUFFIXES)
            or (rel.startswith("additional_chat_templates/") and name.endswith(".jinja")))


def tokenizer_fingerprint(tokenizer, *, root: str | os.PathLike | None = None,
                          verify: bool = False) -> str:
    """A stable content hash of a tokenizer, its chat template included.

    Args:
        tokenizer: a local Hugging Face tokenizer directory (its tokenizer
            files are hashed by content: ``tokenizer.json``,
            ``tokenizer_config.json``, vocab/merges, ``*.tiktoken``, chat
            template files...; weights are not read), a ``transformers``
            tokenizer object (its serialized backend, chat template and
            options), or any object with a ``fingerprint`` string (a vecpack
            encoder).
        root: where the file-hash memo lives (default: the default cache).
        verify: re-read files instead of trusting the memo.
    """
    fp = getattr(tokenizer, "fingerprint", None)
    if isinstance(fp, str) and fp:
        return f"encoder:{type(tokenizer).__qualname__}:{fp}"
    if isinstance(tokenizer, (str, os.PathLike)):
        d = pathlib.Path(tokenizer)
        if d.is_file():  # e.g. a tokenizer.json or tiktoken file on its own
            return "file:" + hashing.hash_files(d, names=True, verify=verify, root=root)
        if not d.is_dir():
            check_tokenizer_dir(tokenizer)
            raise NotADirectoryError(f"tokenizer {str(tokenizer)!r}: not a directory")
        files = sorted(str(p.relative_to(d)).replace(os.sep, "/")
                       for p in d.rglob("*") if p.is_file())
        files = [f for f in files if _is_tokenizer_file(f)]
        if not files:
            raise FileNotFoundError(f"tokenizer: {str(d)!r} holds no tokenizer files "
                                    f"(expected tokenizer.json, tokenizer_config.json, ...)")
        h = hashlib.blake2b(digest_size=16)
        digests = hashing.file_digests([d / rel for rel in files], verify=verify, root=root)
        for rel, digest in zip(files, digests):  # the name and the content of every file
            h.update(f"{rel}\0{digest}\n".encode())
        return f"dir:{h.hexdigest()}"
    return "object:" + _object_fingerprint(tokenizer)


def _object_fingerprint(tok) -> str:
    """A transformers tokenizer object: backend, template, special tokens, options."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{type(tok).__module__}.{type(tok).__qualname__}\n".encode())
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        h.update(backend.to_str().encode())
    elif hasattr(tok, "save_pretrained"):  # slow tokenizers: hash what they save
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            tok.save_pretrained(tmp)
            for p in sorted(pathlib.Path(tmp).rglob("*")):
                if p.is_file():
                    h.update(p.name.encode() + b"\0" + p.read_bytes())
    else:
        raise TypeError(f"tokenizer must be a tokenizer directory, a transformers tokenizer or an "
                        f"encoder with a 'fingerprint'; got {type(tok).__name__}")
    template = getattr(tok, "chat_template", None)
    h.update(b"\0template\0" + json.dumps(template, sort_keys=True, default=str).encode())
    skip = {"name_or_path", "_commit_hash", "tokenizer_file", "vocab_file", "merges_file",
            "special_tokens_map_file", "chat_template", "added_tokens_decoder"}
    kwargs = {k: v for k, v in (getattr(tok, "init_kwargs", None) or {}).items() if k not in skip}
    h.update(json.dumps(kwargs, sort_keys=True, default=str).encode())
    h.update(json.dumps(getattr(tok, "special_tokens_map", {}), sort_keys=True, default=str).encode())
    return h.hexdigest()


def describe(data_files, tokenizer, encoder) -> dict:
    if isinstance(data_files, (str, os.PathLike)):
        names = [os.fspath(data_files)]
    elif isinstance(data_files, (list, tuple)):
        names = [os.fspath(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__ for f in data_files]
    else:
        names = [type(data_files).__name__]
    if isinstance(tokenizer, (str, os.PathLike)):
        tok = os.path.abspath(os.fspath(tokenizer))
    else:
        tok = type(encoder if encoder is not None else tokenizer).__name__
    return {"data_files": [os.path.abspath(n) if os.path.exists(n) else n for n in names], "tokenizer": tok}
