"""One cache entry on disk: its manifest, its arrays' descriptions, and the checks on open.

An entry (or a directory written by :func:`vecpack.save`) is plain ``.npy``
files plus a ``manifest.json`` written last, describing every file: shape,
dtype and checksum of arrays, size and checksum of other files. Opening checks
sizes and ``.npy`` headers against it; ``checksums=True`` re-hashes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import warnings

import numpy as np

from vecpack.store.hashing import checksum_algorithm, file_digest, json_default, mapped_digest
from vecpack.store.objects import iso

__all__ = ["CACHE_LAYOUT_VERSION", "CacheWarning", "CorruptEntry", "Entry", "EntryInfo", "corpus_labels",
           "describe_array", "describe_arrays", "describe_files", "npy_header", "open_arrays", "read_manifest",
           "verify_arrays", "verify_files", "write_manifest"]

#: Version of the on-disk layout (manifest schema, array files). Entries of
#: another layout are removed and rebuilt. 2: a corpus's labels may be the bit
#: mask ``trained.npy`` instead of ``labels.npy`` (see :func:`corpus_labels`).
CACHE_LAYOUT_VERSION = 2

MANIFEST = "manifest.json"
LAST_ACCESS = "last-access"


class CorruptEntry(Exception):
    """An entry failed verification (the message says why)."""


class CacheWarning(UserWarning):
    """A cache entry was found corrupt or incomplete and is being rebuilt."""


@dataclasses.dataclass
class Entry:
    """An opened cache entry.

    Attributes:
        key: the entry's key (also its directory name).
        path: the entry's directory.
        manifest: the parsed ``manifest.json``.
        arrays: name -> read-only ``np.memmap`` (file name without ``.npy``).
        built: True if this call built the entry, False on a hit.
        seconds: time spent in this call (build, or wait plus open).
    """

    key: str
    path: pathlib.Path
    manifest: dict
    arrays: dict[str, np.ndarray]
    built: bool = False
    seconds: float = 0.0

    @property
    def meta(self) -> dict:
        """The ``meta`` dict stored at build time."""
        return self.manifest.get("meta", {})


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """A cache entry as listed by :meth:`Cache.entries` (nothing is opened)."""

    key: str
    kind: str
    path: pathlib.Path
    bytes: int
    created: float
    last_access: float
    manifest: dict

    def to_dict(self) -> dict:
        """JSON-able summary (for ``vecpack cache info``)."""
        return {
            "key": self.key, "kind": self.kind, "path": str(self.path), "bytes": self.bytes,
            "created": iso(self.created), "last_access": iso(self.last_access),
            "vecpack_version": self.manifest.get("vecpack_version"),
            "arrays": {k: {"shape": v["shape"], "dtype": v["dtype"]}
                       for k, v in self.manifest.get("arrays", {}).items()},
            "meta": self.manifest.get("meta", {}),
        }



def npy_header(path: pathlib.Path) -> tuple[tuple, str, bool, int]:
    """(shape, dtype str, fortran_order, data offset) of an ``.npy`` file."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        return tuple(shape), dtype.str, bool(fortran), f.tell()


def describe_arrays(directory: str | os.PathLike, *, checksums: bool = True) -> dict[str, dict]:
    """Manifest records of every ``.npy`` file in ``directory`` (used when writing entries)."""
    return {p.stem: describe_array(p, checksums=checksums) for p in sorted(pathlib.Path(directory).glob("*.npy"))}


def describe_array(path: pathlib.Path, *, checksums: bool = True) -> dict:
    """The manifest record of one ``.npy`` file."""
    shape, dtype, fortran, offset = npy_header(path)
    rec = {"file": path.name, "shape": list(shape), "dtype": dtype, "fortran_order": fortran,
           "header_bytes": offset, "bytes": path.stat().st_size}
    if checksums:
        rec["checksum"] = mapped_digest(path, checksum_algorithm())  # (files this process just wrote)
    return rec


def describe_files(directory: str | os.PathLike, *, checksums: bool = True) -> dict[str, dict]:
    """Manifest records of the other (non-``.npy``) files of an entry."""
    directory = pathlib.Path(directory)
    algo = checksum_algorithm()
    out = {}
    for p in sorted(directory.iterdir()):
        if p.suffix == ".npy" or p.name in (MANIFEST, LAST_ACCESS) or not p.is_file():
            continue
        rec = {"bytes": p.stat().st_size}
        if checksums:
            rec["checksum"] = file_digest(p, algo)
        out[p.name] = rec
    return out


def _checked_size(p: pathlib.Path, rec: dict) -> int:
    """``p``'s size, which must be the manifest's ``rec["bytes"]``; raises ``CorruptEntry``."""
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise CorruptEntry(f"{p.name} is missing") from None
    if size != rec["bytes"]:
        raise CorruptEntry(f"{p.name} has {size} bytes, the manifest says {rec['bytes']}")
    return size


def verify_files(directory: pathlib.Path, records: dict[str, dict], *, checksums: bool = False) -> None:
    """Check the non-array files of an entry; raises ``CorruptEntry``."""
    for name, rec in records.items():
        p = directory / name
        _checked_size(p, rec)
        if checksums and "checksum" in rec:
            got = file_digest(p, rec["checksum"].split(":", 1)[0])
            if got != rec["checksum"]:
                raise CorruptEntry(f"{name} checksum {got} != manifest {rec['checksum']}")


def verify_arrays(directory: pathlib.Path, records: dict[str, dict], *, checksums: bool = False) -> None:
    """Check sizes and ``.npy`` headers (and checksums) against manifest records.

    Raises:
        CorruptEntry: naming the file and what is wrong.
    """
    for rec in records.values():
        p = directory / rec["file"]
        size = _checked_size(p, rec)
        try:
            shape, dtype, fortran, offset = npy_header(p)
        except (ValueError, OSError, SyntaxError) as e:
            raise CorruptEntry(f"{p.name} has a bad .npy header ({e})") from None
        if (list(shape), dtype, fortran, offset) != (rec["shape"], rec["dtype"], rec["fortran_order"],
                                                    rec["header_bytes"]):
            raise CorruptEntry(f"{p.name}: header {shape} {dtype} does not match the manifest "
                                f"{tuple(rec['shape'])} {rec['dtype']}")
        expected = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if expected != size:
            raise CorruptEntry(f"{p.name} holds {size - offset} data bytes, its header needs "
                                f"{expected - offset}")
        if checksums and "checksum" in rec:
            algo = rec["checksum"].split(":", 1)[0]
            try:
                got = file_digest(p, algo)
            except ImportError:
                warnings.warn(f"cannot verify {p}: {algo} needs the xxhash package", CacheWarning,
                              stacklevel=3)
                continue
            if got != rec["checksum"]:
                raise CorruptEntry(f"{p.name} checksum {got} != manifest {rec['checksum']}")


def read_manifest(directory: pathlib.Path) -> dict:
    """Parse and sanity-check ``directory/manifest.json``; raises ``CorruptEntry``."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        raise CorruptEntry("manifest.json is missing") from None
    except (OSError, ValueError) as e:
        raise CorruptEntry(f"manifest.json is unreadable ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("arrays"), dict):
        raise CorruptEntry("manifest.json has no 'arrays' table")
    return manifest


def open_arrays(directory: pathlib.Path, records: dict[str, dict]) -> dict[str, np.ndarray]:
    """Memory-map every array of an entry read-only."""
    out = {}
    for name, rec in records.items():
        out[name] = np.load(directory / rec["file"], mmap_mode="r", allow_pickle=False)
    return out


def corpus_labels(arrays: dict) -> np.ndarray:
    """A corpus's labels as stored: ``trained`` (uint8 bits, where every label is its token or -100;
    see :mod:`vecpack.tokenizing.tokenized`) or ``labels`` (int32). :class:`~vecpack.Packed` and the
    packing kernels take either."""
    return arrays["trained"] if "trained" in arrays else arrays["labels"]


def write_manifest(directory: pathlib.Path, manifest: dict) -> None:
    """Write ``manifest.json`` durably (tmp file, fsync, rename)."""
    tmp = directory / (MANIFEST + ".tmp")
    with open(tmp, "wb") as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True, default=json_default).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)
