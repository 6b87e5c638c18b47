"""The process's read-only LMDB environments, one per database, shared by its views, and the
:class:`Snapshot` (an open read transaction) that keeps a view's offsets valid."""

from __future__ import annotations

import errno
import os
import threading

from ffload.formats.view import dataset_error

__all__ = ["open_env", "release_env", "Snapshot"]


class Snapshot:
    """Keeps an LMDB read transaction open while a view uses its offsets; releases the shared
    environment (see :func:`open_env`) when the view goes."""

    def __init__(self, env_key, env, txn):
        self.env_key, self.env, self.txn = env_key, env, txn

    def close(self) -> None:
        if self.txn is not None:
            self.txn.abort()
            self.txn = None
            release_env(self.env_key)

    def __del__(self):
        self.close()


# LMDB allows one open environment per database per process: views of the same database share
# it ((real path, device, inode of data.mdb) -> [env, number of users]). The inode is part of the
# key so that a database replaced on disk (a new data.mdb) gets a new environment instead of the
# deleted file's.
_ENVS: dict[tuple[str, int, int], list] = {}
_ENVS_LOCK = threading.Lock()
_READ_ONLY_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def open_env(path: str):
    """The process's read-only environment of ``path`` (opened on first use, shared after),
    registered as a reader in ``lock.mdb`` so that writers keep our snapshots' pages; without
    the lock where ``lock.mdb`` cannot be written (read-only media). Returns ``(env, key)``; pair
    with ``release_env(key)``."""
    import lmdb

    real = os.path.realpath(path)
    st = os.stat(os.path.join(real, "data.mdb"))
    key = (real, st.st_dev, st.st_ino)
    with _ENVS_LOCK:
        if key in _ENVS:
            _ENVS[key][1] += 1
            return _ENVS[key][0], key
        try:
            try:
                env = lmdb.open(path, readonly=True, lock=True, subdir=True, readahead=False)
            except lmdb.Error as e:  # lock.mdb not writable: py-lmdb's ReadonlyError is EACCES
                if not (isinstance(e, lmdb.ReadonlyError) or getattr(e, "code", None) in _READ_ONLY_ERRNOS):
                    raise
                env = lmdb.open(path, readonly=True, lock=False, subdir=True, readahead=False)
        except lmdb.Error as e:
            raise dataset_error(path, f"not a readable LMDB database ({e})") from e
        _ENVS[key] = [env, 1]
        return env, key


def release_env(key: tuple[str, int, int]) -> None:
    """Give back one use of the environment :func:`open_env` returned with ``key``; the last
    use closes it. A key no longer held is ignored."""
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _ENVS[key]
            entry[0].close()
