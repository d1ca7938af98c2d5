"""``relstate bench``: the command's work, which :mod:`operators.cli` loads
from the checkout (the bench is not part of the library)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
import tempfile
from pathlib import Path

from bench import BenchConfig, charts, report, versus
from bench.runner import Machine
from bench.runner import run as bench_run
from bench.suites import STORE, SuiteUsageError, load
from operators.cli import DEFAULT_ROWS, QUICK_ROWS

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Run ``relstate bench`` with its parsed ``args``: the store suite, or
    an operator suite against its baseline (``--suite``)."""
    if args.suite != STORE:
        return _bench_suite(args)
    if args.quick:
        config = BenchConfig.quick(args.rows or QUICK_ROWS, large_state=args.large_state)
    else:
        config = BenchConfig(rows=args.rows or DEFAULT_ROWS, large_state=args.large_state)

    def progress(message: str) -> None:
        print(f"relstate bench: {message} ...", file=sys.stderr, flush=True)

    result = bench_run(config, progress)
    print(report.terminal(result), end="")
    if args.no_write:
        return 0
    page: Path = args.output or Path("docs/performance.md")
    page.parent.mkdir(parents=True, exist_ok=True)
    images = charts.draw(result, page.parent / "img")
    if images is None:
        print("matplotlib is not installed: no charts drawn", file=sys.stderr)
    page.write_text(report.markdown(result, images, page), encoding="utf-8")
    print(f"\nwrote {page}" + "".join(f", {p}" for p in (images or {}).values()))
    return 0


def _bench_suite(args: argparse.Namespace) -> int:
    try:
        suite = load(args.suite)
    except KeyError as exc:
        print(f"relstate bench: {exc.args[0]}", file=sys.stderr)
        return 2

    def progress(message: str) -> None:
        print(f"relstate bench --suite {args.suite}: {message} ...", file=sys.stderr, flush=True)

    # A suite is asked only for the options given, and refuses those it lacks.
    given = {
        name: value
        for name, value in (
            ("scale", args.scale if args.scale != 1 else None),
            ("only", args.only),
            ("rounds", args.rounds),
            ("stop_after", args.stop_after),
        )
        if value is not None
    }
    lacking = [n for n in given if n not in inspect.signature(suite).parameters]
    if lacking:
        print(
            f"relstate bench: suite {args.suite!r} takes no "
            + ", ".join(f"--{n.replace('_', '-')}" for n in lacking),
            file=sys.stderr,
        )
        return 2

    # Before the suite starts Spark: the load of other work, not the suite's own.
    machine = Machine.current()
    with tempfile.TemporaryDirectory(prefix=f"relstate-bench-{args.suite}-") as tmp:
        try:
            result = suite(args.quick, Path(tmp), progress, **given)
        except SuiteUsageError as exc:  # say, a workload the suite does not have
            print(f"relstate bench: {exc}", file=sys.stderr)
            return 2
        options = " ".join(
            f"--{name.replace('_', '-')} {_option_text(value)}"
            for name, value in given.items()
            if name != "scale"
        )
        if args.output is not None:
            options = f"{options} --output {args.output}".strip()
        result = dataclasses.replace(result, machine=machine, scale=args.scale, options=options)
    print(versus.terminal(result), end="")
    if args.no_write:
        return 0
    page = args.output or Path("docs/bench") / versus.page_name(args.suite, args.scale)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(versus.markdown(result), encoding="utf-8")
    print(f"\nwrote {page}")
    return 0


def _option_text(value: object) -> str:
    """An option's value as it was given on the command line."""
    if isinstance(value, list):
        return ",".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)
