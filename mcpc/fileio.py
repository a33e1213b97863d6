"""Files the toolchain writes and reads: atomic outputs (a reader never sees a partial file and a
failure leaves the path untouched) and ``.npz`` tensors.

Every file the toolchain writes (.mcpb, IR/assembly text, reports, outputs .npz, traces, example
models) goes through here.  Importable without the compiler (the simulator uses it).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from mcpc.errors import InputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic_with(path: str | os.PathLike, writer: Callable[[str], None]) -> Path:
    """Call ``writer(tmp_path)`` on a temp file beside ``path``, then rename it over ``path``.

    The file gets the usual permissions (0666 less the umask; mkstemp alone would give 0600).
    Raises InputError naming the path when its folder is missing or not writable; any exception
    from ``writer`` removes the temp file and propagates.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputError(f"{path}: cannot write output: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        writer(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_atomic(path: str | os.PathLike, data: str | bytes | Iterable[bytes]) -> Path:
    """Write text (UTF-8), bytes, or an iterable of byte chunks to ``path`` atomically."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    chunks = [data] if isinstance(data, (bytes, bytearray)) else data

    def writer(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)

    return write_atomic_with(path, writer)


def read_npz(path: str | os.PathLike) -> dict:
    """Arrays of an ``.npz`` file keyed by name; InputError naming the file when it is missing or
    not a readable npz (pickled object arrays are refused)."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise InputError(f"{path}: no such inputs file") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InputError(f"{path}: not a readable .npz file ({exc})") from None
