"""The disk tier: KV blocks (kv_blocks.py) as files in a bounded directory, least recently used
out first.

Layout: `<root>/<model key>/<name>.kv`. The root is `--kv-disk-dir` (default `<data_dir>/kv`);
the model key digests the model/weights fingerprint, KV dtype and geometry (kv_blocks.py): one
directory per model. One process uses a root at a time: `DiskRoot` holds an exclusive `flock`
on `<root>/.lock` while open, and a second process finds it held and runs without a disk tier
(`DiskRoot.open` raises `KVTierError`, which the caller logs).

Opening a model's directory (`DiskRoot.tier`): the other models' directories (named as model
keys are: 24 hex digits; nothing else in the root is touched) are unreachable (no name of this
model can lead there) and are deleted at once; temporary files left by a
process killed mid-write too. The remaining files are indexed by name with their sizes, oldest
modification time first, and the oldest deleted until they fit `max_bytes`.

Writing a block: least recently used files are deleted until it fits `max_bytes` (a block
larger than the budget is not written); it goes to `<name>.tmp-<pid>-<n>`, created 0600 (the
engine's user alone may read it: it holds token ids and their K/V), with one `writev`, and is
renamed over its name: a reader never sees half a file, a killed writer leaves only a temporary
file. No fsync: a killed process leaves its writes in the page cache; after a power loss a torn
file fails its checksum. Directories are 0700.

Reading a block: open, one `readv` into the caller's buffers, an exact-length check. A file
gone meanwhile (deleted by hand, by a cleaner) is `missing` and leaves the index. Recency: a
read or a `touch` moves a block to the recent end of the index, and at most once a minute per
file (the injected clock) sets its mtime, so a restart rebuilds nearly the same order.

Every OSError (the directory read-only, the disk full, permissions) raises `KVTierError` for the
caller to count; the tier stays usable. Not thread-safe: the engine's worker thread owns it.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import re
import shutil
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infercache.clock import Clock
from infercache.errors import BlockRejectedError, KVTierError

log = logging.getLogger(__name__)

SUFFIX = ".kv"
MODEL_DIR = re.compile(r"[0-9a-f]{24}")  # kv_blocks.BlockNames.directory_key
LOCK_NAME = ".lock"
MTIME_EVERY_S = 60.0


@dataclass(slots=True)
class _File:
    size: int
    mtime_set_s: float


class DiskRoot:
    """The root directory, locked for this process while open."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None

    def open(self) -> None:
        """Create (0700) and lock the root; raises KVTierError if another process holds it."""
        lock = self.path / LOCK_NAME
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError:  # a read-only directory: its blocks can still be read
                fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise KVTierError(f"cannot open the KV directory {self.path}: {e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            raise KVTierError(f"{self.path} is in use by another engine process") from e
        self._lock_fd = fd

    def tier(self, key: str, *, max_bytes: int, clock: Clock) -> DiskTier:
        """The tier of one model (`key`); every other model's directory is reclaimed."""
        if self._lock_fd is None:
            raise KVTierError("the KV directory is not open")
        try:
            for entry in os.scandir(self.path):
                ours = MODEL_DIR.fullmatch(entry.name) is not None  # never a stranger's folder
                if ours and entry.name != key and entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                    log.info("reclaimed KV blocks of another model: %s", entry.path)
        except OSError as e:
            log.warning("could not reclaim old KV directories under %s: %s", self.path, e)
        return DiskTier(self.path / key, max_bytes=max_bytes, clock=clock)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None


class DiskTier:
    def __init__(self, directory: Path, *, max_bytes: int, clock: Clock) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.directory = directory
        self.max_bytes = max_bytes
        self._clock = clock
        self._files: OrderedDict[str, _File] = OrderedDict()
        self.used_bytes = 0
        self.evicted_files = 0
        self._tmp = itertools.count()
        self._scan()

    def _scan(self) -> None:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            found = []
            for entry in os.scandir(self.directory):
                if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    found.append((st.st_mtime, entry.name[: -len(SUFFIX)], st.st_size))
                elif ".tmp-" in entry.name:  # a write cut short by a kill
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
        except OSError as e:
            log.warning("KV disk tier %s: %s", self.directory, e)
            return
        now_s = self._clock.monotonic_s()
        for _mtime, name, size in sorted(found):
            self._files[name] = _File(size, now_s)
            self.used_bytes += size
        self._make_room(0)

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def __len__(self) -> int:
        return len(self._files)

    def _path(self, name: str) -> Path:
        return self.directory / (name + SUFFIX)

    def read(self, name: str, buffers: Sequence[Any]) -> bool:
        """Fill `buffers` (in order) from block `name`; False when the file is gone. Raises
        BlockRejectedError when its length is not exactly theirs, KVTierError when it cannot be
        read."""
        expected = sum(memoryview(b).nbytes for b in buffers)
        try:
            fd = os.open(self._path(name), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._forget(name)
            return False
        except OSError as e:
            raise KVTierError(f"reading KV block {name}: {e}") from e
        try:
            got = os.readv(fd, list(buffers))
            size = os.fstat(fd).st_size
        except OSError as e:
            raise KVTierError(f"reading KV block {name}: {e}") from e
        finally:
            os.close(fd)
        if got != expected or size != expected:
            raise BlockRejectedError("truncated", f"{name} has {size} bytes, {expected} expected")
        self.touch(name)
        return True

    def write(self, name: str, buffers: Sequence[Any]) -> bool:
        """Store block `name` from `buffers` (written in order); False when it cannot fit the
        budget. Raises KVTierError when the write fails."""
        size = sum(memoryview(b).nbytes for b in buffers)
        if size > self.max_bytes:
            return False
        self.discard(name)
        self._make_room(size)
        tmp = self.directory / f"{name}.tmp-{os.getpid()}-{next(self._tmp)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            try:
                fd = os.open(tmp, flags, 0o600)
            except FileNotFoundError:  # the directory was removed under us: make it again
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(tmp, flags, 0o600)
            try:
                written = os.writev(fd, list(buffers))
            finally:
                os.close(fd)
            if written != size:
                raise OSError(f"short write: {written} of {size} bytes")
            os.replace(tmp, self._path(name))
        except OSError as e:
            with contextlib.suppress(OSError):  # never created (ENOENT, EROFS, EACCES)
                tmp.unlink()
            raise KVTierError(f"writing KV block {name}: {e}") from e
        self._files[name] = _File(size, self._clock.monotonic_s())
        self.used_bytes += size
        return True

    def touch(self, name: str) -> None:
        """Mark block `name` just used (no-op if absent)."""
        entry = self._files.get(name)
        if entry is None:
            return
        self._files.move_to_end(name)
        now_s = self._clock.monotonic_s()
        if now_s - entry.mtime_set_s >= MTIME_EVERY_S:
            entry.mtime_set_s = now_s
            try:
                os.utime(self._path(name))
            except FileNotFoundError:
                self._forget(name)
            except OSError as e:
                log.debug("KV block %s: mtime not updated: %s", name, e)

    def discard(self, name: str) -> None:
        """Delete block `name` (a rejected block, or one being replaced)."""
        if self._forget(name):
            with contextlib.suppress(OSError):
                self._path(name).unlink()

    def _forget(self, name: str) -> bool:
        entry = self._files.pop(name, None)
        if entry is None:
            return False
        self.used_bytes -= entry.size
        return True

    def _make_room(self, size: int) -> None:
        while self._files and self.used_bytes + size > self.max_bytes:
            name = next(iter(self._files))
            self.discard(name)
            self.evicted_files += 1
