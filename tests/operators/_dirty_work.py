"""A join -> aggregate pipeline fed a users change log that retracts users
it never inserted (an unknown delete and an unknown update), as the tests of
the unknown-retractions policy run it in the harness and on Spark; and the
result batch SQL gives over the valid rows."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from operators import Pipeline, Stream
from operators.aggregate import Aggregate, GroupAggregate
from operators.join import StreamingJoin

KIND = pa.field("row_kind", pa.string())
ORDERS = pa.schema([("order_id", pa.int64()), ("user_id", pa.int64()), ("amount", pa.int64())])
USERS = pa.schema(
    [("id", pa.int64()), ("country", pa.string()), ("plan", pa.string()), ("seq", pa.int64())]
)
RESULT = ["country", "plan", "revenue", "orders"]


def users(rows: list[tuple[Any, ...]]) -> pa.Table:
    """A users change log: ``(row_kind, id, country, plan, seq)`` per row."""
    columns = list(zip(*rows, strict=True))
    return pa.Table.from_arrays(
        [pa.array(list(c), f.type) for c, f in zip(columns[1:], USERS, strict=True)]
        + [pa.array(list(columns[0]), pa.string())],
        schema=USERS.append(KIND),
    )


def orders(rows: list[tuple[int, int, int]]) -> pa.Table:
    """Orders ``(order_id, user_id, amount)``, inserts only."""
    return pa.Table.from_pylist(
        [dict(zip(ORDERS.names, r, strict=True)) for r in rows], schema=ORDERS
    )


#: Two batches: users 1 and 2 and four orders (of users 1 to 4); then a
#: delete of user 3 and an update of user 4, neither ever inserted, a new
#: user 5 and an order of theirs.
BATCHES = [
    (
        orders([(10, 1, 50), (11, 2, 40), (12, 3, 30), (13, 4, 20)]),
        users([("+I", 1, "US", "pro", 1), ("+I", 2, "DE", "free", 2)]),
    ),
    (
        orders([(14, 5, 10)]),
        users(
            [
                ("-D", 3, "US", "pro", 3),
                ("-U", 4, "DE", "free", 4),
                ("+U", 4, "DE", "pro", 5),
                ("+I", 5, "US", "pro", 6),
            ]
        ),
    ),
]

#: The unknown retractions: the rows batch SQL leaves out.
UNKNOWN = {(3, "US", "pro", 3), (4, "DE", "free", 4)}

#: Flink's join applies them: the pairs they would have made are retracted
#: (order 12 of user 3, order 13 of user 4 as 'free'), although never emitted.
APPLIED = Counter({("US", "pro", 30, 1): 1, ("DE", "pro", 20, 1): 1})


def build(pipeline: Pipeline, order_stream: Stream, user_stream: Stream) -> Stream:
    """Orders joined with their user, then revenue and order count per
    (country, plan): each stage keyed by what its operator declares."""
    join = StreamingJoin(
        "inner",
        order_stream.schema,
        user_stream.schema,
        ["user_id"],
        ["id"],
        left_unique_key=["order_id"],
        right_unique_key=["id"],
        name="join",
    )
    joined = pipeline.stage(join, order_stream, user_stream)
    per_plan = GroupAggregate(
        joined.schema,
        ["country", "plan"],
        [Aggregate.sum("amount", "revenue"), Aggregate.count(name="orders")],
        name="per_plan",
    )
    return pipeline.stage(per_plan, joined)


def batch_sql(spark: Any | None = None) -> Counter[tuple[Any, ...]]:
    """The result over the valid rows (every row but the unknown
    retractions; a +U is the user's row): with ``spark`` by Spark SQL, else
    by the same join and grouping in Arrow."""
    order_rows = pa.concat_tables([o for o, _ in BATCHES])
    valid = [
        r
        for _, u in BATCHES
        for r in u.to_pylist()
        if (r["id"], r["country"], r["plan"], r["seq"]) not in UNKNOWN
    ]
    user_rows = pa.Table.from_pylist(valid, schema=USERS.append(KIND)).drop_columns(["row_kind"])
    if spark is not None:
        spark.createDataFrame(order_rows.to_pandas()).createOrReplaceTempView("orders")
        spark.createDataFrame(user_rows.to_pandas()).createOrReplaceTempView("users")
        rows = spark.sql(
            "SELECT country, plan, SUM(amount) AS revenue, COUNT(*) AS orders FROM orders "
            "JOIN users ON orders.user_id = users.id GROUP BY country, plan"
        ).collect()
        return Counter(tuple(r[c] for c in RESULT) for r in rows)
    joined = order_rows.join(user_rows, "user_id", "id", join_type="inner")
    grouped = joined.group_by(["country", "plan"]).aggregate(
        [("amount", "sum"), ("amount", "count")]
    )
    return Counter(
        (r["country"], r["plan"], r["amount_sum"], r["amount_count"]) for r in grouped.to_pylist()
    )


#: An orders change log whose second file is malformed: two rows of unknown
#: kinds among good ones.
CHANGES = pa.schema(
    [
        ("order_id", pa.int64()),
        ("customer", pa.string()),
        ("amount", pa.int64()),
        ("seq", pa.int64()),
    ]
)
GOOD_AND_BAD = [
    [("+I", 1, "a", 10, 1), ("+I", 2, "b", 20, 2)],
    [("+I", 3, "a", 5, 3), ("+X", 4, "b", 7, 4), ("??", 5, "c", 1, 5), ("+I", 6, "b", 1, 6)],
]
#: The rows of unknown kinds, as the dead-letter table holds them.
BAD = {("+X", 4), ("??", 5)}
TOTALS = ["customer", "revenue", "orders"]


def changes(rows: list[tuple[Any, ...]]) -> pa.Table:
    """An orders change log: ``(row_kind, order_id, customer, amount, seq)`` per row."""
    return pa.Table.from_pylist(
        [dict(zip(["row_kind", *CHANGES.names], r, strict=True)) for r in rows],
        schema=CHANGES.append(KIND),
    )


def totals(pipeline: Pipeline, stream: Stream) -> Stream:
    """Revenue and order count per customer."""
    per_customer = GroupAggregate(
        stream.schema,
        ["customer"],
        [Aggregate.sum("amount", "revenue"), Aggregate.count(name="orders")],
        name="per_customer",
    )
    return pipeline.stage(per_customer, stream)


def totals_sql(spark: Any | None = None) -> Counter[tuple[Any, ...]]:
    """Batch SQL over the good rows (all inserts): with ``spark`` by Spark SQL."""
    good = [r for batch in GOOD_AND_BAD for r in batch if (r[0], r[1]) not in BAD]
    if spark is not None:
        spark.createDataFrame(changes(good).to_pandas()).createOrReplaceTempView("changes")
        rows = spark.sql(
            "SELECT customer, SUM(amount) AS revenue, COUNT(*) AS orders FROM changes "
            "GROUP BY customer"
        ).collect()
        return Counter(tuple(r[c] for c in TOTALS) for r in rows)
    grouped = changes(good).group_by("customer").aggregate([("amount", "sum"), ("amount", "count")])
    return Counter((r["customer"], r["amount_sum"], r["amount_count"]) for r in grouped.to_pylist())
