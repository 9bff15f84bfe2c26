#!/usr/bin/env python3
"""A FUSE passthrough file system that forgets what was not synced when the power is cut.

Used by tests/powercut.rs. Usage:

    powercut_fs.py BACKING MOUNTPOINT CONTROL_DIR

Every operation on MOUNTPOINT is done on the files under BACKING (the disk's volatile state:
what a running program reads back). Beside it the file system keeps the *durable* state,
which is what a power cut leaves:

* File content: a copy per file (CONTROL_DIR/shadow/<id>, one id per inode) holding the
  content as of the file's last fsync/fdatasync. A write marks its 4 KiB pages dirty; a sync
  copies the dirty pages and the size into the copy. A file that was never synced has empty
  durable content. (fdatasync and fsync are treated alike: both make the data and the size
  durable.)
* Directory entries: per directory, the names (and which file id or subdirectory each one
  is) as of the directory's last fsync. Creating, unlinking or renaming a file changes the
  durable directory only when the directory itself is synced (POSIX: a file's fsync does
  not make its name durable; SQLite syncs the directory after creating a WAL or journal).
* Everything present when the file system starts counts as durable (a clean boot).

The -shm file that SQLite maps is a file like any other: never synced, so it reverts.

A cut is asked for by writing CONTROL_DIR/request (the test renames a finished file into
place), one line:

* `drop`: every file reverts to its durable content and every directory to its durable
  entries: all written-but-unsynced data is gone.
* `torn SEED`: as `drop`, but each unsynced dirty page of a file the durable tree names is
  kept (its newest content) or dropped at random (probability 1/2, seeded), and the file's
  size is its durable or its current size at random (pages past the durable size that are
  dropped read back as zeros): a disk that wrote some of its cache, in any order, before
  the power went.

From the cut on, every operation fails with EIO (the disk is off): the test kills the
program first, asks for the cut, unmounts and starts a new file system on BACKING, which now
holds what survived. The answer is CONTROL_DIR/report.json: the mode, the dirty (unsynced) pages
in all and per file, how many were dropped and kept, the files and directories rebuilt. CONTROL_DIR/ready appears once
the file system is mounted; CONTROL_DIR/error.txt says why it stopped if it failed.

Not modelled (refused with EPERM so a program that needs them fails loudly): hard links,
symbolic links, special files. Directory renames are modelled like file renames (entries
of both parents become durable when each parent is synced).

Debian: `apt-get install python3-fusepy fuse3` (the module is `fusepy` there, `fuse` from
PyPI).
"""

import errno
import json
import os
import random
import shutil
import stat
import sys
import threading
import time
import traceback

try:
    import fusepy as fuse_mod  # Debian's python3-fusepy
except ImportError:  # pragma: no cover - PyPI's fusepy installs `fuse`
    try:
        import fuse as fuse_mod
    except ImportError:
        sys.stderr.write("powercut_fs.py needs fusepy: apt-get install python3-fusepy fuse3\n")
        sys.exit(3)

if not hasattr(fuse_mod, "FUSE"):
    sys.stderr.write("the `fuse` module found is not fusepy: apt-get install python3-fusepy\n")
    sys.exit(3)

FUSE = fuse_mod.FUSE
FuseOSError = fuse_mod.FuseOSError
Operations = fuse_mod.Operations

PAGE = 4096


def _err(code):
    return FuseOSError(code)


class PowercutFs(Operations):
    """The passthrough with a durable shadow; every method holds one lock."""

    use_ns = True

    def __init__(self, backing, ctl):
        self.root = os.path.realpath(backing)
        self.ctl = ctl
        self.shadow = os.path.join(ctl, "shadow")
        self.mu = threading.RLock()
        self.frozen = False
        self.next_id = 1
        # inode number of a live file under `root` -> our id
        self.ids = {}
        # id -> set of dirty page numbers (written since the last sync)
        self.dirty = {}
        # ids that have a durable copy in `shadow`
        self.has_shadow = set()
        # fh -> (fd, id)
        self.fds = {}
        self.next_fh = 1
        # dir path relative to root ('' is the root) -> {name: ('f', id) | ('d', None)}
        self.durable = {}
        self.stats = {"syncs": 0, "dirsyncs": 0, "writes": 0}
        shutil.rmtree(self.shadow, ignore_errors=True)
        os.makedirs(self.shadow)
        self._snapshot_all()

    # ---- identity and the durable model -------------------------------------------------

    def _real(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def _rel(self, path):
        return path.strip("/")

    def _new_id(self, ino):
        i = self.next_id
        self.next_id += 1
        self.ids[ino] = i
        self.dirty[i] = set()
        return i

    def _id_of_ino(self, ino):
        i = self.ids.get(ino)
        return i if i is not None else self._new_id(ino)

    def _entries(self, rel):
        """The current entries of directory `rel`, as the durable model records them."""
        out = {}
        real = os.path.join(self.root, rel)
        for name in os.listdir(real):
            st = os.lstat(os.path.join(real, name))
            if stat.S_ISDIR(st.st_mode):
                out[name] = ("d", None)
            elif stat.S_ISREG(st.st_mode):
                out[name] = ("f", self._id_of_ino(st.st_ino))
        return out

    def _snapshot_all(self):
        """At start everything on the backing directory is durable."""
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel
            self.durable[rel] = self._entries(rel)
            for name in filenames:
                real = os.path.join(dirpath, name)
                st = os.lstat(real)
                if stat.S_ISREG(st.st_mode):
                    i = self._id_of_ino(st.st_ino)
                    shutil.copyfile(real, os.path.join(self.shadow, str(i)))
                    self.has_shadow.add(i)

    def _mark(self, i, offset, length):
        if length <= 0:
            return
        d = self.dirty.setdefault(i, set())
        d.update(range(offset // PAGE, (offset + length - 1) // PAGE + 1))

    def _sync_file(self, i, fd):
        """fsync/fdatasync: the dirty pages and the size become durable."""
        size = os.fstat(fd).st_size
        sp = os.path.join(self.shadow, str(i))
        sfd = os.open(sp, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            for p in sorted(self.dirty.get(i, ())):
                off = p * PAGE
                if off >= size:
                    continue
                os.pwrite(sfd, os.pread(fd, PAGE, off), off)
            os.ftruncate(sfd, size)
        finally:
            os.close(sfd)
        self.dirty[i] = set()
        self.has_shadow.add(i)
        self.stats["syncs"] += 1

    def _check(self):
        if self.frozen:
            raise _err(errno.EIO)

    # ---- the cut --------------------------------------------------------------------------

    def cut(self, mode, seed):
        with self.mu:
            self.frozen = True
            rng = random.Random(seed)
            # Where each live id's newest content can be read: an open fd, else its path.
            live_fd = {}
            for fd, i in self.fds.values():
                live_fd.setdefault(i, fd)
            live_path = {}
            for dirpath, _dirs, files in os.walk(self.root):
                for name in files:
                    real = os.path.join(dirpath, name)
                    st = os.lstat(real)
                    i = self.ids.get(st.st_ino)
                    if i is not None:
                        live_path.setdefault(i, real)
            named = set()
            for entries in self.durable.values():
                for kind, i in entries.values():
                    if kind == "f":
                        named.add(i)
            dropped = sum(len(p) for p in self.dirty.values())
            by_file = {}
            for i, pages in self.dirty.items():
                if pages:
                    where = live_path.get(i)
                    name = os.path.relpath(where, self.root) if where else "(unlinked)"
                    by_file[name] = by_file.get(name, 0) + len(pages)
            kept = 0
            if mode == "torn":
                for i in sorted(named):
                    pages = self.dirty.get(i)
                    if not pages:
                        continue
                    fd = live_fd.get(i)
                    opened = None
                    if fd is None and i in live_path:
                        opened = fd = os.open(live_path[i], os.O_RDONLY)
                    if fd is None:
                        continue
                    try:
                        kept += self._tear(i, fd, pages, rng)
                    finally:
                        if opened is not None:
                            os.close(opened)
            for fd, _i in list(self.fds.values()):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.fds.clear()
            # Rebuild the backing directory from the durable state.
            for name in os.listdir(self.root):
                real = os.path.join(self.root, name)
                if os.path.isdir(real) and not os.path.islink(real):
                    shutil.rmtree(real)
                else:
                    os.unlink(real)
            files = dirs = 0
            stack = [""]
            while stack:
                rel = stack.pop()
                for name, (kind, i) in sorted(self.durable.get(rel, {}).items()):
                    child = os.path.join(rel, name) if rel else name
                    real = os.path.join(self.root, child)
                    if kind == "d":
                        os.mkdir(real)
                        dirs += 1
                        stack.append(child)
                    else:
                        sp = os.path.join(self.shadow, str(i))
                        if i in self.has_shadow:
                            shutil.copyfile(sp, real)
                        else:
                            open(real, "wb").close()
                        files += 1
            return {
                "mode": mode,
                "seed": seed,
                "dirty_pages": dropped,
                "kept_pages": kept,
                "dropped_pages": dropped - kept,
                "dirty_by_file": by_file,
                "files": files,
                "dirs": dirs,
                "syncs": self.stats["syncs"],
                "dirsyncs": self.stats["dirsyncs"],
                "writes": self.stats["writes"],
            }

    def _tear(self, i, fd, pages, rng):
        """Torn mode: some unsynced pages reach the durable copy; returns how many."""
        sp = os.path.join(self.shadow, str(i))
        sfd = os.open(sp, os.O_RDWR | os.O_CREAT, 0o600)
        kept = 0
        try:
            dsize = os.fstat(sfd).st_size if i in self.has_shadow else 0
            csize = os.fstat(fd).st_size
            size = csize if rng.random() < 0.5 else dsize
            if size > dsize:
                os.ftruncate(sfd, size)  # dropped pages past the old end read as zeros
            for p in sorted(pages):
                off = p * PAGE
                if off >= size or rng.random() >= 0.5:
                    continue
                data = os.pread(fd, min(PAGE, size - off), off)
                data += b"\0" * (min(PAGE, size - off) - len(data))
                os.pwrite(sfd, data, off)
                kept += 1
            os.ftruncate(sfd, size)
        finally:
            os.close(sfd)
        self.has_shadow.add(i)
        return kept

    # ---- FUSE operations --------------------------------------------------------------------

    def init(self, path):
        with open(os.path.join(self.ctl, "ready.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.rename(os.path.join(self.ctl, "ready.tmp"), os.path.join(self.ctl, "ready"))

    def getattr(self, path, fh=None):
        with self.mu:
            self._check()
            try:
                st = os.lstat(self._real(path))
            except OSError as e:
                raise _err(e.errno)
            return {
                "st_mode": st.st_mode,
                "st_nlink": st.st_nlink,
                "st_size": st.st_size,
                "st_uid": st.st_uid,
                "st_gid": st.st_gid,
                "st_atime": st.st_atime_ns,
                "st_mtime": st.st_mtime_ns,
                "st_ctime": st.st_ctime_ns,
                "st_blocks": st.st_blocks,
                "st_blksize": st.st_blksize,
            }

    def access(self, path, amode):
        with self.mu:
            self._check()
            if not os.access(self._real(path), amode):
                raise _err(errno.EACCES)
            return 0

    def readdir(self, path, fh):
        with self.mu:
            self._check()
            try:
                return [".", ".."] + os.listdir(self._real(path))
            except OSError as e:
                raise _err(e.errno)

    def statfs(self, path):
        with self.mu:
            self._check()
            sv = os.statvfs(self._real(path))
            return {
                k: getattr(sv, k)
                for k in (
                    "f_bavail",
                    "f_bfree",
                    "f_blocks",
                    "f_bsize",
                    "f_favail",
                    "f_ffree",
                    "f_files",
                    "f_flag",
                    "f_frsize",
                    "f_namemax",
                )
            }

    def _register(self, fd, i):
        fh = self.next_fh
        self.next_fh += 1
        self.fds[fh] = (fd, i)
        return fh

    def open(self, path, flags):
        with self.mu:
            self._check()
            try:
                fd = os.open(self._real(path), flags & ~(os.O_CREAT | os.O_EXCL))
            except OSError as e:
                raise _err(e.errno)
            i = self._id_of_ino(os.fstat(fd).st_ino)
            if flags & os.O_TRUNC:
                self._mark(i, 0, PAGE)
            return self._register(fd, i)

    def create(self, path, mode, fi=None):
        with self.mu:
            self._check()
            real = self._real(path)
            try:
                fd = os.open(real, os.O_RDWR | os.O_CREAT, mode)
            except OSError as e:
                raise _err(e.errno)
            ino = os.fstat(fd).st_ino
            i = self.ids.get(ino)
            if i is None:
                i = self._new_id(ino)
            return self._register(fd, i)

    def read(self, path, size, offset, fh):
        with self.mu:
            self._check()
            fd, _i = self.fds[fh]
            return os.pread(fd, size, offset)

    def write(self, path, data, offset, fh):
        with self.mu:
            self._check()
            fd, i = self.fds[fh]
            try:
                n = os.pwrite(fd, data, offset)
            except OSError as e:
                raise _err(e.errno)
            self._mark(i, offset, n)
            self.stats["writes"] += 1
            return n

    def truncate(self, path, length, fh=None):
        with self.mu:
            self._check()
            try:
                if fh is not None and fh in self.fds:
                    fd, i = self.fds[fh]
                    os.ftruncate(fd, length)
                else:
                    fd = os.open(self._real(path), os.O_WRONLY)
                    try:
                        os.ftruncate(fd, length)
                        i = self._id_of_ino(os.fstat(fd).st_ino)
                    finally:
                        os.close(fd)
            except OSError as e:
                raise _err(e.errno)
            # The page holding the new end (and a changed size) must be synced to count.
            self._mark(i, length - (length % PAGE), PAGE)
            return 0

    def flush(self, path, fh):
        with self.mu:
            self._check()
            return 0

    def release(self, path, fh):
        with self.mu:
            entry = self.fds.pop(fh, None)
            if entry is not None:
                try:
                    os.close(entry[0])
                except OSError:
                    pass
            return 0

    def fsync(self, path, datasync, fh):
        with self.mu:
            self._check()
            fd, i = self.fds[fh]
            self._sync_file(i, fd)
            return 0

    def opendir(self, path):
        with self.mu:
            self._check()
            return 0

    def releasedir(self, path, fh):
        return 0

    def fsyncdir(self, path, datasync, fh):
        with self.mu:
            self._check()
            rel = self._rel(path)
            self.durable[rel] = self._entries(rel)
            self.stats["dirsyncs"] += 1
            return 0

    def _forget(self, real):
        """`real` loses its name: its inode number may be reused by a new file."""
        try:
            st = os.lstat(real)
        except OSError:
            return
        if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
            self.ids.pop(st.st_ino, None)

    def unlink(self, path):
        with self.mu:
            self._check()
            real = self._real(path)
            try:
                st = os.lstat(real)
                os.unlink(real)
            except OSError as e:
                raise _err(e.errno)
            if st.st_nlink <= 1:
                self.ids.pop(st.st_ino, None)
            return 0

    def rename(self, old, new):
        with self.mu:
            self._check()
            if os.path.lexists(self._real(new)) and not os.path.isdir(self._real(new)):
                self._forget(self._real(new))
            try:
                os.rename(self._real(old), self._real(new))
            except OSError as e:
                raise _err(e.errno)
            return 0

    def mkdir(self, path, mode):
        with self.mu:
            self._check()
            try:
                os.mkdir(self._real(path), mode)
            except OSError as e:
                raise _err(e.errno)
            return 0

    def rmdir(self, path):
        with self.mu:
            self._check()
            try:
                os.rmdir(self._real(path))
            except OSError as e:
                raise _err(e.errno)
            return 0

    def chmod(self, path, mode):
        with self.mu:
            self._check()
            os.chmod(self._real(path), mode)
            return 0

    def chown(self, path, uid, gid):
        with self.mu:
            self._check()
            os.chown(self._real(path), uid, gid)
            return 0

    def utimens(self, path, times=None):
        with self.mu:
            self._check()
            if times is None:
                os.utime(self._real(path))
            else:
                os.utime(self._real(path), ns=(int(times[0]), int(times[1])))
            return 0

    def _refuse(self, *args):
        raise _err(errno.EPERM)

    link = symlink = mknod = _refuse

    def readlink(self, path):
        raise _err(errno.EINVAL)

    def getxattr(self, path, name, position=0):
        raise _err(errno.ENODATA)

    def listxattr(self, path):
        return []


def control_loop(fs, ctl):
    """Waits for CONTROL_DIR/request, cuts, writes CONTROL_DIR/report.json."""
    req = os.path.join(ctl, "request")
    while True:
        time.sleep(0.005)
        if not os.path.exists(req):
            continue
        with open(req) as f:
            words = f.read().split()
        os.unlink(req)
        mode = words[0] if words else "drop"
        seed = int(words[1]) if len(words) > 1 else 0
        try:
            report = fs.cut("torn" if mode == "torn" else "drop", seed)
        except Exception:  # noqa: BLE001 - reported to the test, which fails with it
            report = {"error": traceback.format_exc()}
        tmp = os.path.join(ctl, "report.tmp")
        with open(tmp, "w") as f:
            json.dump(report, f)
        os.rename(tmp, os.path.join(ctl, "report.json"))


def main():
    if len(sys.argv) != 4:
        sys.stderr.write(__doc__)
        sys.exit(2)
    backing, mnt, ctl = sys.argv[1:]
    os.makedirs(ctl, exist_ok=True)
    for name in ("ready", "report.json", "request", "error.txt"):
        try:
            os.unlink(os.path.join(ctl, name))
        except FileNotFoundError:
            pass
    fs = PowercutFs(backing, ctl)
    threading.Thread(target=control_loop, args=(fs, ctl), daemon=True).start()
    try:
        FUSE(
            fs,
            mnt,
            foreground=True,
            nothreads=False,
            big_writes=True,
            hard_remove=True,
            fsname="powercut",
        )
    except Exception:  # noqa: BLE001 - the test reads why
        with open(os.path.join(ctl, "error.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise


if __name__ == "__main__":
    main()
