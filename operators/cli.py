"""The ``relstate`` command.

``relstate demo`` runs a complete stateful pipeline on local Spark (the README's
first command). ``relstate bench`` runs the benchmark: it prints a table of
ratios (and the checkpoint load and replay figures) and writes them, with
charts, to ``docs/performance.md``. ``relstate inspect`` prints a checkpoint's
metadata or rows without Spark; ``relstate repartition`` rewrites a stopped
query's state for a new partition count.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["main"]

DEFAULT_ROWS = 1_000_000
QUICK_ROWS = 50_000


def _rows(text: str) -> int:
    try:
        rows = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of rows, got {text!r}") from None
    if rows < 100:
        raise argparse.ArgumentTypeError(f"must be at least 100, got {rows}")
    return rows


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("must name at least one workload")
    return names


def _minutes(text: str) -> float:
    try:
        minutes = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of minutes, got {text!r}") from None
    if not minutes > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 minutes, got {text!r}")
    return minutes


def _scale(text: str) -> int:
    try:
        scale = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if scale < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {scale}")
    return scale


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relstate", description="Relational state tables on RocksDB for Spark."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = commands.add_parser(
        "bench",
        help="benchmark the encodings, StateTable against raw rocksdict, and checkpoints",
        description=(
            "Measure, side by side in one run: the row layout against the cell layout, "
            "StateTable against raw rocksdict, batch against per-row encoding, and "
            "checkpoint commits on a small against a large state, with load and replay "
            "times. Prints the figures and writes them, with charts, to a markdown page."
        ),
    )
    bench.add_argument(
        "--rows",
        type=_rows,
        default=None,
        help=f"rows per table (default {DEFAULT_ROWS:,}; {QUICK_ROWS:,} with --quick)",
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help=f"a run of well under a minute: {QUICK_ROWS:,} rows, fewer reads",
    )
    bench.add_argument(
        "--large-state",
        action="store_true",
        help="also time checkpoint commits on a state of ten times --rows rows (minutes more)",
    )
    bench.add_argument(
        "--output",
        type=Path,
        help="the page to write; charts go to img/ beside it (default: docs/performance.md; "
        "with an operator --suite, docs/bench/NAME.md)",
    )
    bench.add_argument(
        "--no-write", action="store_true", help="print the table only; write no files"
    )
    bench.add_argument(
        "--suite",
        default="store",
        metavar="NAME",
        help=(
            "what to measure: 'store' (the default: encodings, StateTable, checkpoints) "
            "or an operator against its baseline on Spark: 'join', 'append_join', "
            "'dedup', 'fkjoin', 'aggregate', 'topn', a StatefulProcessor against Spark's "
            "transformWithStateInPandas and a native operator: 'tws', a two-stage pipeline "
            "in one query against two chained queries: 'pipeline', or the changelog "
            "operators against Flink SQL: 'flink' (these write docs/bench/NAME.md)"
        ),
    )
    bench.add_argument(
        "--scale",
        type=_scale,
        default=1,
        metavar="N",
        help=(
            "with an operator --suite: N times its default size (writes "
            "docs/bench/NAME-xN.md); a run at 10 takes many minutes"
        ),
    )
    bench.add_argument(
        "--only",
        type=_names,
        metavar="NAMES",
        help="with --suite flink: only these workloads, comma-separated (e.g. aggregate,topn)",
    )
    bench.add_argument(
        "--rounds",
        type=_scale,
        metavar="N",
        help="with --suite flink: N counted rounds (default 3)",
    )
    bench.add_argument(
        "--stop-after",
        type=_minutes,
        metavar="MINUTES",
        help="with --suite flink: cancel a counted Flink query still running after "
        "MINUTES; its time, and relstate's speed-up over it, then count as lower bounds",
    )
    bench.set_defaults(handler=_bench)

    demo = commands.add_parser(
        "demo",
        help="run a complete stateful pipeline on local Spark",
        description=(
            "Orders and customers changelogs arrive file by file; one Spark query joins "
            "them, keeps revenue per segment and the top 5 customers by revenue in "
            "relstate state tables, and the result after every batch is checked against "
            "Spark batch SQL over the inputs so far."
        ),
    )
    demo.add_argument(
        "--dir",
        type=Path,
        default=Path("relstate-demo"),
        help="working directory (default: ./relstate-demo)",
    )
    demo.add_argument("--batches", type=int, default=6, help="micro-batches (default 6)")
    demo.add_argument(
        "--orders", type=int, default=2_000, help="order changes per batch (default 2,000)"
    )
    demo.add_argument("--partitions", type=int, default=4, help="state partitions (default 4)")
    demo.add_argument(
        "--crash-after",
        type=int,
        metavar="N",
        help=(
            "kill the pipeline (SIGKILL) during batch N (numbered from 0, as the tables "
            "number them), after its outputs are written and before it is recorded"
        ),
    )
    demo.add_argument(
        "--resume", action="store_true", help="finish a killed run from its checkpoint"
    )
    demo.add_argument(
        "--state-location",
        metavar="URI",
        help="keep relstate's state here (s3://bucket/path, say) instead of in the checkpoint",
    )
    demo.set_defaults(handler=_demo)

    inspect = commands.add_parser(
        "inspect",
        help="show a checkpoint's operators, tables, partitions and versions, or rows",
        description=(
            "Print the metadata of a query's state (operators, tables and schemas, "
            "partitions, kept versions, sizes) or, with --table/--batch/--limit, a "
            "table's rows. Reads the checkpoint only; starts no Spark."
        ),
    )
    inspect.add_argument("checkpoint", help="the query's checkpoint or its state location")
    inspect.add_argument("--operator", help="the operator (default: the only one)")
    inspect.add_argument("--table", help="print this table's rows")
    inspect.add_argument(
        "--batch", type=int, help="the batch to read (default: the latest committed)"
    )
    inspect.add_argument("--partition", type=int, help="only this partition's rows")
    inspect.add_argument(
        "--limit", type=int, default=20, help="rows to print with --table (default 20)"
    )
    inspect.set_defaults(handler=_inspect)

    repartition = commands.add_parser(
        "repartition",
        help="rewrite a stopped query's state for a new partition count",
        description=(
            "Rewrite the state of a stopped query for --partitions partitions; the "
            "query then resumes with the new count and the same results. The old "
            "state is kept beside it as <state>.before-repartition-<batch>-<old>-to-<new>; "
            "if it is interrupted, run it again."
        ),
    )
    repartition.add_argument("checkpoint", help="the query's checkpoint or its state location")
    repartition.add_argument("--partitions", type=int, required=True, help="the new count")
    repartition.add_argument(
        "--force",
        action="store_true",
        help=(
            "repartition even though a partition has versions after the last recorded batch "
            "(left by a failed batch of a stopped query; never use it on a running query)"
        ),
    )
    repartition.set_defaults(handler=_repartition)
    return parser


def _inspect(args: argparse.Namespace) -> int:
    from operators._checkpoint.location import StateLocation
    from operators._tools.inspect import describe, rows
    from operators.errors import InputError
    from statestore import RelstateError

    # relstate's log events go to stderr, warnings and errors only unless
    # RELSTATE_LOG asks for more (statestore._log): stdout is the command's.
    try:
        location = StateLocation(args.checkpoint)
        if args.table is None and args.partition is None:
            print(describe(location, args.batch, args.operator), end="")
        else:
            text = rows(location, args.operator, args.table, args.batch, args.limit, args.partition)
            print(text, end="")
    except (InputError, RelstateError) as exc:
        print(f"relstate inspect: {exc}", file=sys.stderr)
        return 2
    return 0


def _repartition(args: argparse.Namespace) -> int:
    from operators._tools.repartition import repartition
    from operators.errors import InputError
    from statestore import RelstateError

    def progress(message: str) -> None:
        print(f"relstate repartition: {message}", file=sys.stderr, flush=True)

    try:
        result = repartition(args.checkpoint, args.partitions, progress=progress, force=args.force)
    except (InputError, RelstateError) as exc:
        print(f"relstate repartition: {exc}", file=sys.stderr)
        return 2
    print(
        f"operator {result.operator}: batch {result.batch_id} repartitioned from "
        f"{result.old_partitions} to {result.new_partitions} partitions "
        f"({', '.join(f'{t}: {n} rows' for t, n in result.rows.items())}); the old "
        f"state is kept at {result.backup}"
    )
    if result.keyless:
        print(f"keyless stage(s) {list(result.keyless)} kept their one partition")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from operators._tools.demo import DemoConfig, run_demo
    from operators.errors import InputError, RunnerError

    try:
        config = DemoConfig(
            directory=args.dir,
            batches=args.batches,
            orders_per_batch=args.orders,
            partitions=args.partitions,
            crash_after=args.crash_after,
            resume=args.resume,
            state_location=args.state_location,
        )
        return 0 if run_demo(config) else 1
    except (InputError, RunnerError) as exc:
        print(f"relstate demo: {exc}", file=sys.stderr)
        return 2


def _bench(args: argparse.Namespace) -> int:
    try:
        run = _bench_command()
    except FileNotFoundError as exc:
        print(f"relstate bench: {exc}", file=sys.stderr)
        return 2
    return run(args)


def _bench_command() -> Callable[[argparse.Namespace], int]:
    """The bench's command, from the ``bench`` package of the source checkout
    this library sits in. The bench is not part of the library (the wheel
    leaves it out, and nothing in the library imports it): it is found by
    its place beside ``operators/``, or not at all."""
    root = Path(__file__).resolve().parents[1]
    command = root / "bench" / "command.py"
    if not command.is_file():
        raise FileNotFoundError(
            f"no bench/ beside {root / 'operators'}: the bench runs from a source "
            "checkout of relstate (git clone, then run relstate there), not from an "
            "installed wheel"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    module = importlib.import_module("bench.command")
    if Path(module.__file__ or "").resolve() != command:
        raise FileNotFoundError(
            f"the bench package imported is {module.__file__}, not the one beside the "
            f"library ({command}): run relstate from the checkout's root"
        )
    run: Callable[[argparse.Namespace], int] = module.run
    return run


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``relstate`` command with ``argv`` (default: the process's arguments)."""
    import structlog

    args = _parser().parse_args(argv)
    # A command may quiet relstate's log events for its run; whoever called
    # main in-process (a test, a notebook) gets their configuration back.
    before = structlog.get_config()
    try:
        code: int = args.handler(args)
    finally:
        structlog.configure(**before)
    return code


if __name__ == "__main__":
    sys.exit(main())
