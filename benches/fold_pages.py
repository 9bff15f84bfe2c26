#!/usr/bin/env python3
"""WAL pages one 1-minute fold writes, by the layout of the tier table (a measurement for the
next write-wear change, not the agent's own code).

The agent keeps tier rows that have not settled in `rollups_recent`, a WITHOUT ROWID table
keyed by (tier, bucket, series) (migration 0014), and each 1-minute fold appends one row per
active series at the end of the 1-minute range. This script builds that table in SQLite
(Python's `sqlite3`, 4 KiB pages, incremental auto-vacuum, WAL) with three hours of 1-minute
rows and six hours of 1-hour rows for 666 series (the reference device workload) and 88-byte
payloads, then times 60 folds by the WAL bytes each one adds, for four layouts:

  - WITHOUT ROWID, the 1-hour rows sorting after the 1-minute ones (the agent's layout);
  - WITHOUT ROWID, no 1-hour rows (the 1-minute range last);
  - a rowid table keyed by one integer (tier, bucket, series), the 1-hour rows after;
  - the same with the 1-minute rows last.

SQLite appends to the last leaf of a rowid table without rebalancing its neighbours (its
"quick balance"); an index b-tree (WITHOUT ROWID) always rebalances, which rewrites the
previous leaf and leaves it partly empty. Standard library only.

    python3 benches/fold_pages.py
"""

import os
import random
import sqlite3
import tempfile

SERIES = 666
FOLDS = 60
PAYLOAD = 88
HOURS_OF_MINUTES = 3
COARSE_BUCKETS = 6
FRAME = 4096 + 24


def fold_frames(rowid: bool, coarse_after: bool, with_coarse: bool = True) -> tuple[float, int]:
    """Mean WAL frames per fold and the database's pages after the folds."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.db")
        c = sqlite3.connect(path, isolation_level=None)
        c.execute("PRAGMA page_size = 4096")
        c.execute("PRAGMA auto_vacuum = INCREMENTAL")
        c.execute("PRAGMA journal_mode = WAL")
        c.execute("PRAGMA wal_autocheckpoint = 0")
        if rowid:
            c.execute("CREATE TABLE r (k INTEGER PRIMARY KEY, data BLOB)")
        else:
            c.execute(
                "CREATE TABLE r (tier INTEGER, bucket INTEGER, series INTEGER, data BLOB, "
                "PRIMARY KEY (tier, bucket, series)) WITHOUT ROWID"
            )
        rnd = random.Random(1)
        minute, hour = (1, 2) if coarse_after else (2, 1)

        def insert(tier: int, bucket: int, series: int) -> None:
            blob = rnd.randbytes(PAYLOAD)
            if rowid:
                c.execute("INSERT INTO r VALUES (?, ?)", ((tier << 56) | (bucket << 24) | series, blob))
            else:
                c.execute("INSERT INTO r VALUES (?, ?, ?, ?)", (tier, bucket, series, blob))

        c.execute("BEGIN")
        for b in range(HOURS_OF_MINUTES * 60):
            for s in range(SERIES):
                insert(minute, b, s)
        if with_coarse:
            for b in range(COARSE_BUCKETS):
                for s in range(SERIES):
                    insert(hour, b, s)
        c.execute("COMMIT")
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        frames = []
        for f in range(FOLDS):
            before = os.path.getsize(path + "-wal")
            c.execute("BEGIN")
            for s in range(SERIES):
                insert(minute, HOURS_OF_MINUTES * 60 + f, s)
            c.execute("COMMIT")
            frames.append((os.path.getsize(path + "-wal") - before) // FRAME)
        pages = c.execute("PRAGMA page_count").fetchone()[0]
        c.close()
        return sum(frames) / len(frames), pages


def main() -> None:
    print(f"{SERIES} series, {PAYLOAD}-byte rows, {FOLDS} folds on {HOURS_OF_MINUTES} h of 1-minute rows")
    print("| layout | WAL frames per fold | pages after |")
    print("|---|---|---|")
    for label, args in [
        ("WITHOUT ROWID, 1-hour rows after (the agent's)", (False, True, True)),
        ("WITHOUT ROWID, no 1-hour rows", (False, True, False)),
        ("rowid key, 1-hour rows after", (True, True, True)),
        ("rowid key, 1-minute rows last", (True, False, True)),
    ]:
        frames, pages = fold_frames(*args)
        print(f"| {label} | {frames:.1f} | {pages} |")


if __name__ == "__main__":
    main()
