"""The Flink side of ``relstate bench --suite flink``: a script run by the
Python of Flink's own virtual environment (PyFlink pins packages that clash
with relstate's), never imported by relstate.

It keeps one JVM, and so Flink's warm code, for the whole suite, and takes
commands from standard input, one JSON object a line, answering each with
one line ``RELSTATE-FLINK {json}`` on standard output (anything else there
is Flink's own printing):

- ``{"op": "env", "name": N, "config": {...}}``: a streaming table
  environment named ``N`` with those configuration options;
- ``{"op": "ddl", "env": N, "sql": S}``: run the statement ``S`` there;
- ``{"op": "run", "env": N, "sql": S}``: run the ``INSERT`` statement ``S``
  to its end; the answer's ``seconds`` is its wall time, from submission;
  with ``"limit": L``, a job still running after ``L`` seconds is cancelled
  and the answer adds ``"stopped": true``;
- ``{"op": "quit"}``.

An error answers ``{"error": text}`` and the worker goes on.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from typing import Any

MARK = "RELSTATE-FLINK "


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _finished_within(result: Any, limit: float) -> bool:
    """Whether the job of ``result`` ended within ``limit`` seconds (a job
    that failed raises)."""
    try:
        result.wait(max(int(limit * 1000), 1))
    except Exception as exc:  # py4j wraps Java's TimeoutException
        if "TimeoutException" in str(exc):
            return False
        raise
    return True


def _cancel(result: Any) -> None:
    """Cancel the job of ``result`` and wait until it has ended."""
    result.get_job_client().cancel().result()
    with contextlib.suppress(Exception):  # a cancelled job ends in an error
        result.wait()


def main() -> None:
    # Flink's own environment has PyFlink; relstate's (and its type check) has not.
    from pyflink.table import (  # type: ignore[import-not-found,unused-ignore]
        EnvironmentSettings,
        TableEnvironment,
    )

    envs: dict[str, Any] = {}
    _answer({"ready": True})
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "quit":
                _answer({"bye": True})
                return
            if op == "env":
                env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
                for key, value in command["config"].items():
                    env.get_config().set(key, str(value))
                envs[command["name"]] = env
                _answer({"ok": True})
            elif op == "ddl":
                envs[command["env"]].execute_sql(command["sql"])
                _answer({"ok": True})
            elif op == "run":
                started = time.perf_counter()
                result = envs[command["env"]].execute_sql(command["sql"])
                limit = command.get("limit")
                if limit is None:
                    result.wait()
                    _answer({"seconds": time.perf_counter() - started})
                elif _finished_within(result, limit):
                    _answer({"seconds": time.perf_counter() - started})
                else:
                    seconds = time.perf_counter() - started
                    _cancel(result)
                    _answer({"seconds": seconds, "stopped": True})
            else:
                _answer({"error": f"unknown op {op!r}"})
        except Exception:
            _answer({"error": traceback.format_exc()})


if __name__ == "__main__":
    main()
