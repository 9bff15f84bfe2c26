#!/usr/bin/env python3
"""Pads a kept store (a copy: `device_budget.py --keep`) with old 1-minute tier rows until its
file reaches a size, so that `device_budget.py --seed` can measure a store at its disk budget
without days of warm-up (docs/performance.md, "A store at its disk budget").

The rows copy the values and sketch of one of the store's own 1-minute rows, for each series
the 1-minute tier already has, in buckets starting DAYS before its oldest one (inside the
default 30-day retention, so only the budget evicts them), and the tier's row counter is
raised by as many. Run it on a stopped store only. Standard library only.

    python3 scripts/pad_store.py DIR/edgewatch.db --mib 250 [--days 12]
"""

import argparse
import sqlite3

NS = 1_000_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db", help="the store's edgewatch.db (a copy, agent stopped)")
    ap.add_argument("--mib", type=int, required=True, help="the file's size to reach, MiB")
    ap.add_argument("--days", type=int, default=12, help="how old the first padded bucket is (default 12)")
    args = ap.parse_args()
    c = sqlite3.connect(args.db, isolation_level=None)
    cols = "count, sum, min, max, first_ts, first, last_ts, last, sketch"
    row = c.execute(
        f"SELECT {cols} FROM rollups_recent WHERE tier = 60 ORDER BY length(sketch) DESC LIMIT 1"
    ).fetchone()
    if row is None:
        raise SystemExit("the store has no 1-minute rows to copy")
    series = [r[0] for r in c.execute("SELECT DISTINCT series_id FROM rollups_recent WHERE tier = 60")]
    oldest = c.execute("SELECT MIN(bucket) FROM rollups_recent WHERE tier = 60").fetchone()[0]
    page = c.execute("PRAGMA page_size").fetchone()[0]
    bucket = oldest - args.days * 86_400 * NS
    bucket -= bucket % (60 * NS)
    target = args.mib << 20
    added = 0
    while c.execute("PRAGMA page_count").fetchone()[0] * page < target:
        c.execute("BEGIN")
        for _ in range(10):
            c.executemany(
                f"INSERT INTO rollups_recent (tier, bucket, series_id, {cols}) VALUES (60, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(bucket, s) + tuple(row) for s in series],
            )
            added += len(series)
            bucket += 60 * NS
            if bucket >= oldest:
                raise SystemExit("ran into the store's own rows: ask for fewer MiB or more --days")
        c.execute("UPDATE counters SET value = value + ? WHERE name = 'rows_60'", (len(series) * 10,))
        c.execute("COMMIT")
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pages = c.execute("PRAGMA page_count").fetchone()[0]
    print(f"{added} rows added over {len(series)} series; {pages * page / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
