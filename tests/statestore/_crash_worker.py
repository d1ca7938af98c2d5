"""A worker process for crash tests, and the workload model the tests share.

Run as ``python -m tests.statestore._crash_worker LOCATION LOCAL_DIR VERSIONS
SEED INTERVAL RETAIN``: it loads the newest version, then for each of
``VERSIONS`` new versions applies random operations to two state tables (a row
table and a cell table with watermark cleaning), prints ``["begin", version,
ops]`` before the commit and ``["done", version]`` after it returns (and after
the winner is recorded), and closes the store. A test sets ``RELSTATE_FAULT`` to
kill it at a fault point, then rebuilds the committed state from these lines.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import pyarrow as pa

from encoding import TableSchema
from statestore import StateStore, StoreConfig

OPERATOR = "op"
KV = TableSchema(1, pa.schema([("k", pa.int64()), ("v", pa.string())]), ["k"], name="kv")
CELLS = TableSchema(
    2,
    pa.schema([("g", pa.int64()), ("k", pa.int64()), ("n", pa.int64())]),
    ["g", "k"],
    layout="cell",
    name="cells",
)
TABLES = (KV, CELLS)

#: A model of the committed state: table name -> primary key -> row.
Model = dict[str, dict[tuple[Any, ...], tuple[Any, ...]]]
Op = list[Any]


def empty_model() -> Model:
    return {"kv": {}, "cells": {}}


def store_state(store: StateStore) -> Model:
    """What the store's tables hold, in the model's shape."""
    kv = {(r[0],): tuple(r) for r in store.table("kv").scan()}
    cells = {(r[0], r[1]): tuple(r) for r in store.table("cells").scan()}
    return {"kv": kv, "cells": cells}


def apply_ops(model: Model, ops: list[Op]) -> Model:
    """The model after ``ops`` (a new model; the argument is unchanged)."""
    out = {name: dict(rows) for name, rows in model.items()}
    for op in ops:
        kind = op[0]
        if kind == "kv_put":
            out["kv"][(op[1],)] = (op[1], op[2])
        elif kind == "kv_del":
            del out["kv"][(op[1],)]
        elif kind == "cell_put":
            out["cells"][(op[1], op[2])] = (op[1], op[2], op[3])
        elif kind == "cell_del":
            del out["cells"][(op[1], op[2])]
        elif kind == "clean":
            out["cells"] = {k: r for k, r in out["cells"].items() if k[0] >= op[1]}
        else:
            raise ValueError(f"unknown op {op!r}")
    return out


def random_ops(rng: random.Random, store: StateStore, version: int, n: int = 24) -> list[Op]:
    """Apply ``n`` random operations to the store's tables; return them."""
    kv, cells = store.table("kv"), store.table("cells")
    ops: list[Op] = []
    kv_keys = [r[0] for r in kv.scan()]
    cell_rows = list(cells.scan())
    low = min((r[0] for r in cell_rows), default=version)
    for i in range(n):
        roll = rng.random()
        if roll < 0.35 or not kv_keys:
            key = version * 1000 + i
            kv.insert((key, f"v{version}-{i}"))
            kv_keys.append(key)
            ops.append(["kv_put", key, f"v{version}-{i}"])
        elif roll < 0.55:
            key = rng.choice(kv_keys)
            old = kv.get_row((key,))
            assert old is not None
            new = (key, f"u{version}-{i}")
            kv.update(old, new)
            ops.append(["kv_put", key, new[1]])
        elif roll < 0.7:
            key = kv_keys.pop(rng.randrange(len(kv_keys)))
            row = kv.get_row((key,))
            assert row is not None
            kv.delete(row)
            ops.append(["kv_del", key])
        elif roll < 0.9:
            g, k = version + rng.randrange(3), version * 1000 + i
            kv_row = (g, k, None if rng.random() < 0.2 else rng.randrange(10**6))
            cells.insert(kv_row)
            cell_rows.append(kv_row)
            ops.append(["cell_put", *kv_row])
        elif roll < 0.95 and cell_rows:
            row = cell_rows.pop(rng.randrange(len(cell_rows)))
            cells.delete(row)
            ops.append(["cell_del", row[0], row[1]])
        else:
            watermark = low + 1
            cells.clean_below(watermark)
            cell_rows = [r for r in cell_rows if r[0] >= watermark]
            low = watermark
            ops.append(["clean", watermark])
    return ops


def config(local_dir: str, interval: int, retain: int) -> StoreConfig:
    return StoreConfig(
        snapshot_interval=interval,
        retain_versions=retain,
        local_dir=local_dir,
        partition_count=4,
        io_threads=2,
        # Small, so that most versions spill part of their writes.
        spill_rows=8,
    )


def main(argv: list[str]) -> None:
    location, local_dir, versions, seed, interval, retain = argv
    rng = random.Random(int(seed))
    store = StateStore(location, OPERATOR, 0, TABLES, config(local_dir, int(interval), int(retain)))
    existing = store.versions()
    latest = existing[-1] if existing else None
    store.load(latest)
    print(json.dumps(["loaded", latest]), flush=True)
    start = 1 if latest is None else latest + 1
    for version in range(start, start + int(versions)):
        ops = random_ops(rng, store, version)
        print(json.dumps(["begin", version, ops]), flush=True)
        info = store.commit(version)
        store.record_winner(version, info.commit_id)
        print(json.dumps(["done", version]), flush=True)
    store.close()
    print(json.dumps(["closed"]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
