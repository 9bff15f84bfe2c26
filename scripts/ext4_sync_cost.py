#!/usr/bin/env python3
"""What one synced 4 KiB write costs the block device on ext4, by how the block is placed.

Makes a 512 MiB ext4 image on a loop device (root; Debian `e2fsprogs` and `mount`), then
writes 300 blocks of 4 KiB, each followed by `fdatasync`, three ways: appended (a new block
each time: allocation, a file-system journal commit), overwritten in place (a block the file
already has), and into space `posix_fallocate` reserved (unwritten extents converted on
write). Prints the device KiB per write (`/sys/block/loopN/stat`, sectors written). This is
why the agent's files cost the device more while they first grow (the WAL's first 16 MiB, a
new journal) than once they are reused in place. Standard library only.

    sudo python3 scripts/ext4_sync_cost.py
"""
import os
import subprocess
import tempfile

WRITES = 300


def main():
    work = tempfile.mkdtemp(prefix="ext4-sync-cost-")
    img, mnt = os.path.join(work, "fs.img"), os.path.join(work, "mnt")
    with open(img, "wb") as f:
        f.truncate(512 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", img], check=True)
    dev = subprocess.run(["losetup", "-f", "--show", img], check=True, capture_output=True, text=True).stdout.strip()
    os.makedirs(mnt)
    subprocess.run(["mount", dev, mnt], check=True)

    def sectors():
        os.sync()
        with open(f"/sys/block/{os.path.basename(dev)}/stat") as f:
            return int(f.read().split()[6])

    fd = os.open(os.path.join(mnt, "f"), os.O_RDWR | os.O_CREAT)
    try:
        block = b"x" * 4096
        reserved = 64 << 20
        os.posix_fallocate(fd, reserved, WRITES * 4096)
        for mode in ("appended", "overwritten in place", "into fallocated space"):
            s0 = sectors()
            for i in range(WRITES):
                off = {"appended": i * 4096, "overwritten in place": 0, "into fallocated space": reserved + i * 4096}[mode]
                os.pwrite(fd, block, off)
                os.fdatasync(fd)
            kib = (sectors() - s0) * 512 / 1024
            print(f"{mode:>22}: {kib / WRITES:5.1f} KiB on the device per synced 4 KiB write")
    finally:
        os.close(fd)
        subprocess.run(["umount", mnt])
        subprocess.run(["losetup", "-d", dev])
        os.unlink(img)
        os.rmdir(mnt)
        os.rmdir(work)


if __name__ == "__main__":
    main()
