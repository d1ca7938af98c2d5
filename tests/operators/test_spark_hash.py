"""Spark's Murmur3 hash and hash partitioning, computed in Python, against
Spark's own F.hash."""

from __future__ import annotations

import datetime as dt
import decimal
import random
from typing import Any

import pyarrow as pa
import pytest

from operators._engine.spark_hash import spark_hash, spark_partition, supported

#: Column types the runner's keys may have, and a random value of each.
TYPES: dict[str, tuple[pa.DataType, Any]] = {
    "b": (pa.bool_(), lambda r: r.random() < 0.5),
    "i8": (pa.int8(), lambda r: r.randint(-128, 127)),
    "i16": (pa.int16(), lambda r: r.randint(-(2**15), 2**15 - 1)),
    "i32": (pa.int32(), lambda r: r.randint(-(2**31), 2**31 - 1)),
    "i64": (pa.int64(), lambda r: r.randint(-(2**63), 2**63 - 1)),
    "f32": (pa.float32(), lambda r: r.choice([0.0, -0.0, 1.5, r.uniform(-1e6, 1e6)])),
    "f64": (pa.float64(), lambda r: r.choice([0.0, -0.0, float("nan"), r.uniform(-1e9, 1e9)])),
    "s": (pa.string(), lambda r: "".join(r.choice("aé€😀bc") for _ in range(r.randint(0, 9)))),
    "bin": (pa.binary(), lambda r: bytes(r.randint(0, 255) for _ in range(r.randint(0, 9)))),
    "d": (pa.date32(), lambda r: dt.date(1970, 1, 1) + dt.timedelta(days=r.randint(-9000, 30000))),
    "ts": (
        pa.timestamp("us", tz="UTC"),
        lambda r: (
            dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
            + dt.timedelta(microseconds=r.randint(-(10**15), 10**15))
        ),
    ),
    "dec": (pa.decimal128(12, 3), lambda r: decimal.Decimal(r.randint(-(10**11), 10**11)) / 1000),
}


def _rows(seed: int, n: int) -> pa.Table:
    rng = random.Random(seed)
    columns = {
        name: pa.array([None if rng.random() < 0.1 else make(rng) for _ in range(n)], type=dtype)
        for name, (dtype, make) in TYPES.items()
    }
    return pa.table(columns)


class TestKnownValues:
    def test_spark_documented_values(self) -> None:
        """hash(1) and hash(1L) are Spark's well-known values; a null leaves the seed."""
        assert spark_hash([1], [pa.int32()]) == -559580957
        assert spark_hash([1], [pa.int64()]) == -1712319331
        assert spark_hash([None], [pa.int32()]) == 42

    def test_partition_is_non_negative(self) -> None:
        """pmod keeps partitions in 0..n-1 for negative hashes too."""
        assert spark_hash([1], [pa.int32()]) < 0
        assert spark_partition([1], [pa.int32()], 7) == (-559580957) % 7

    def test_unsupported_types(self) -> None:
        """Unsigned integers and wide decimals are refused by supported()."""
        assert not supported(pa.uint32())
        assert not supported(pa.decimal128(30, 2))
        assert all(supported(t) for t, _ in TYPES.values())


@pytest.mark.spark
class TestAgainstSpark:
    def test_every_type_and_combination_matches_f_hash(self, spark: Any) -> None:
        """For 300 random rows of every key type (with nulls), each column's hash
        and the hash of several multi-column keys equal Spark's F.hash."""
        from pyspark.sql import functions as F

        table = _rows(seed=8, n=300)
        combos = [[c] for c in TYPES] + [["s", "i64"], ["i32", "s", "d"], ["ts", "b", "bin"]]
        df = spark.createDataFrame(table)
        assert [f.dataType.simpleString() for f in df.schema.fields] == list(_SPARK_TYPES.values())
        hashes = [F.hash(*cols).alias("_".join(cols)) for cols in combos]
        got = df.select(*hashes).collect()
        rows = table.to_pylist()
        for row, spark_row in zip(rows, got, strict=True):
            for cols in combos:
                ours = spark_hash([row[c] for c in cols], [TYPES[c][0] for c in cols])
                assert ours == spark_row["_".join(cols)], (cols, [row[c] for c in cols])


_SPARK_TYPES = {
    "b": "boolean",
    "i8": "tinyint",
    "i16": "smallint",
    "i32": "int",
    "i64": "bigint",
    "f32": "float",
    "f64": "double",
    "s": "string",
    "bin": "binary",
    "d": "date",
    "ts": "timestamp",
    "dec": "decimal(12,3)",
}
