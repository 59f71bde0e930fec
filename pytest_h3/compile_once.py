"""Each Triton kernel specialization compiled once per node, not once per xdist worker.

Triton keeps compiled kernels in an on-disk cache that every process of a user shares, but a process that misses
compiles even while another one compiles the same key: on a GPU node whose eight workers meet the same kernels at
once (a kernel item and the power item of the same op), each compiles them, and compiling, not running, is where a
cold gate run spends its time. This cache manager, installed through Triton's own ``TRITON_CACHE_MANAGER`` hook,
takes a lock per cache key around a miss: the first process compiles, the others wait and load its binary. filelock
(the lock library this project uses everywhere) holds an OS file lock, which the OS drops if its holder dies; a
holder that keeps it past :data:`WAIT_SECONDS` lets the waiter compile for itself, as Triton alone would (with a
warning naming the kernel), since the cache is only ever a shortcut to the same binary. A manager the user set in
``TRITON_CACHE_MANAGER`` is kept.
"""

from __future__ import annotations

import os
import warnings

from filelock import FileLock, Timeout
from triton.runtime.cache import FileCacheManager

ENV = "TRITON_CACHE_MANAGER"
MANAGER = f"{__name__}:CompileOnce"
WAIT_SECONDS = 600.0
LOCK_FILE = "compiling.lock"


def install() -> None:
    """Make this manager Triton's for this process and the workers it starts, unless the user chose one."""
    os.environ.setdefault(ENV, MANAGER)


class CompileOnce(FileCacheManager):
    """Triton's file cache; a miss of a kernel's group (what :func:`triton.compile` looks up first) holds the key's
    lock until the compiled group is stored. A compile that raised stores none: its lock goes with the manager,
    which is the compile's own (filelock releases a lock it collects)."""

    def __init__(self, key, override=False, dump=False):
        super().__init__(key, override=override, dump=dump)
        self._compiling: FileLock | None = None
        self._locks = not (override or dump)

    def get_group(self, filename: str):
        group = super().get_group(filename)
        if group is not None or not self._locks or self._compiling is not None:
            return group
        lock = FileLock(os.path.join(self.cache_dir, LOCK_FILE))
        try:
            lock.acquire(timeout=WAIT_SECONDS)
        except Timeout:
            warnings.warn(f"Triton kernel {filename.removesuffix('.json')}: another process has held its compile lock "
                          f"({lock.lock_file}) for {WAIT_SECONDS:.0f} s; compiling it here too", stacklevel=2)
            return None
        group = super().get_group(filename)  # another process stored it while this one waited
        if group is not None:
            lock.release()
            return group
        self._compiling = lock
        return None

    def put_group(self, filename: str, group):
        try:
            return super().put_group(filename, group)
        finally:
            self._release()

    def _release(self) -> None:
        if self._compiling is not None:
            self._compiling.release()
            self._compiling = None
