"""Reading and writing the tool's files: atomic writes, digests, and one error type for a bad file.

Every file is written to a temporary sibling, flushed, fsynced and renamed over the target, so a crash or
a full disk leaves the old file or none, never half of one. JSON is written one value per line with sorted
keys, so a bounds file diffs readably in review.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


class FileFormatError(ValueError):
    """A file the tool reads is missing, unreadable or not what it should be; the message names the file."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = Path(path)
        super().__init__(f"{path}: {reason}")


DIGEST_CACHE = Path(os.environ.get("H3GATE_CACHE", Path.home() / ".cache" / "h3gate")) / "file-digests.json"


def file_digest(path: Path) -> str:
    """sha256 of a file, cached by (path, size, mtime) so a 100 GB checkpoint is hashed once, not every run. Each file
    is hashed under a lock of its own: xdist workers opening one checkpoint at once hash it once, the others wait for
    its digest (eight workers reading a 194.5 GB folder side by side would each take many minutes)."""
    from filelock import FileLock

    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    locks = DIGEST_CACHE.parent / "digest-locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(str(locks / f"{sha256_bytes(key.encode())[:32]}.lock")):
        with FileLock(str(DIGEST_CACHE) + ".lock"):
            cache = json.loads(DIGEST_CACHE.read_text()) if DIGEST_CACHE.is_file() else {}
        if key in cache:
            return cache[key]
        digest = sha256_file(path)
        with FileLock(str(DIGEST_CACHE) + ".lock"):
            cache = json.loads(DIGEST_CACHE.read_text()) if DIGEST_CACHE.is_file() else {}
            cache[key] = digest
            temporary = DIGEST_CACHE.with_suffix(".tmp")
            temporary.write_text(json.dumps(cache, indent=1, sort_keys=True))
            os.replace(temporary, DIGEST_CACHE)
    return digest


def file_digests(paths: list[Path], progress=None) -> list[str]:
    """:func:`file_digest` of each path, in order, on several threads: hashlib releases the GIL while it hashes, so a
    fast disk's files hash in parallel. ``progress`` is the stream of a bar over the bytes past 1 GB (none when None);
    a first look at a release checkpoint reads 194.5 GB."""
    from tqdm import tqdm

    total = sum(path.stat().st_size for path in paths)
    with tqdm(total=total, unit="B", unit_scale=True, desc="hashing", disable=progress is None or total < 1e9,
              file=progress) as bar, \
            ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        def hashed(path: Path) -> str:
            digest = file_digest(path)
            bar.update(path.stat().st_size)
            return digest

        return list(pool.map(hashed, paths))


def sha256_file(path: str | os.PathLike) -> str:
    with open(path, "rb") as handle:
        return _sha256_stream(handle)


def _sha256_stream(handle) -> str:
    digest = hashlib.sha256()
    for chunk in iter(lambda: handle.read(1 << 24), b""):
        digest.update(chunk)
    return digest.hexdigest()


MAX_JSON_BYTES = 256 << 20  # a release run's evidence is a few MB; a bigger JSON file is hostile or broken


def open_regular(path: str | os.PathLike, what: str):
    """``path`` opened for reading, when it is a regular file (after symlinks): a FIFO, a device such as /dev/zero or
    a folder where a file is expected would hang, exhaust memory or fail later with a traceback. Opened without
    blocking, so a FIFO is refused instead of waited on. Anything else is a :class:`FileFormatError` naming it."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileFormatError(path, f"missing ({what} expected)") from None
    except OSError as error:
        raise FileFormatError(path, f"unreadable {what}: {error.strerror or error}") from None
    mode = os.fstat(handle).st_mode
    if not stat.S_ISREG(mode):
        os.close(handle)
        kind = "a folder" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
        raise FileFormatError(path, f"is {kind}, not a regular file; a {what} is a plain file")
    return os.fdopen(handle, "rb")


def read_regular(path: str | os.PathLike, what: str, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`), refused past ``limit`` bytes without reading
    more than that into memory."""
    with open_regular(path, what) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileFormatError(path, f"over {limit:,} bytes: too large for a {what}")
    return data


def sha256_regular(path: str | os.PathLike, what: str) -> str:
    """sha256 of the regular file ``path``, refusing anything else as :func:`open_regular` does."""
    with open_regular(path, what) as handle:
        return _sha256_stream(handle)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dumps(value) -> str:
    """Canonical JSON text: sorted keys, one value per line."""
    return json.dumps(value, indent=1, sort_keys=True, allow_nan=True) + "\n"


class WriteError(OSError):
    """A file could not be written (full disk, no permission); nothing half-written was left behind."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _umask()  # read once: os.umask can only be read by setting it, which other threads would see


def write_atomic(path: str | os.PathLike, data: bytes | str, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and rename. The file gets ``mode``, by default the
    one it had, or for a new file the one ``open`` would give it (mkstemp's own, 0600, would hide a repository's files
    from its other users); set before any byte is written."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
        if mode is None:
            mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o666 & ~UMASK
        os.fchmod(handle, mode)
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except OSError as error:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
        previous = "the previous file is intact" if path.exists() else "no file was created"
        raise WriteError(
            error.errno, f"cannot write {path} ({error.strerror or error}); {previous}: free space or fix permissions, then run again"
        ) from error
    except BaseException:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def signals_deferred():
    """SIGINT and SIGTERM held until the block ends, then delivered: files that must agree with each other (an evidence
    envelope and its SHA256SUMS) are written whole or not at all by a Ctrl-C. Only the main thread receives signals;
    elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)


def write_json(path: str | os.PathLike, value) -> None:
    write_atomic(path, dumps(value))


MAX_JSON_DEPTH = 64  # the tool's own files nest about 10 deep; more is hostile or broken


def _depth(value) -> int:
    """Nesting depth of parsed JSON, counted without recursion (a hostile file must not overflow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (value.values() if isinstance(value, dict) else value))
    return deepest


def loads_limited(text: str | bytes, where, what: str):
    """JSON from untrusted bytes: malformed JSON, integers past Python's digit limit and nesting deeper than
    :data:`MAX_JSON_DEPTH` are one :class:`FileFormatError` naming ``where``, never a traceback."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise FileFormatError(where, f"nested too deeply to be a {what}") from None
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError, and the int digit limit
        raise FileFormatError(where, f"not valid JSON ({str(error).splitlines()[0]}); expected a {what}") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise FileFormatError(where, f"nested deeper than {MAX_JSON_DEPTH} levels: not a {what}")
    return value


def read_json(path: str | os.PathLike, what: str) -> dict:
    """A JSON object from ``path``; anything else is a :class:`FileFormatError` saying it is not a ``what``."""
    path = Path(path)
    value = loads_limited(read_regular(path, what), path, what)
    if not isinstance(value, dict):
        raise FileFormatError(path, f"expected a JSON object ({what}), found {type(value).__name__}")
    return value


def require(path, data: dict, key: str, types, what: str):
    """``data[key]`` checked against ``types``; a missing or mistyped field names the file and the field."""
    if key not in data:
        raise FileFormatError(path, f"{what} lacks the field {key!r}")
    value = data[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise FileFormatError(path, f"{what} field {key!r} must be {_names(types)}, found a boolean")
    if not isinstance(value, types):
        raise FileFormatError(path, f"{what} field {key!r} must be {_names(types)}, found {type(value).__name__}")
    return value


def _names(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)
