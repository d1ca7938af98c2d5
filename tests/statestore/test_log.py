"""relstate's log events: quiet by default, configured by code, by RELSTATE_LOG,
and by the driver's configuration carried to a worker."""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from encoding import TableSchema
from statestore import (
    LogConfig,
    LogConfigError,
    StateStore,
    StoreConfig,
    apply_log_config,
    capture_events,
    configure_logging,
    current_log_config,
    get_logger,
)

KV = TableSchema(1, pa.schema([("k", pa.string()), ("v", pa.int64())]), ["k"], name="kv")


@pytest.fixture(autouse=True)
def no_configuration(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts from the default: nothing set in code or the environment."""
    monkeypatch.delenv("RELSTATE_LOG", raising=False)
    apply_log_config(None)
    yield
    apply_log_config(None)


def commit_once(tmp_path: Path) -> None:
    """Load and commit one version of a store: INFO events state_store.load/commit."""
    store = StateStore(
        str(tmp_path / "ckpt"), "op", 0, [KV], StoreConfig(local_dir=str(tmp_path / "local"))
    )
    try:
        store.load(None)
        store.table("kv").insert(("a", 1))
        store.commit(1)
    finally:
        store.close()


class TestDefault:
    def test_info_events_print_nothing(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """By default a store's load and commit (INFO events) print nothing on stdout or stderr."""
        commit_once(tmp_path)
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == ""

    def test_warnings_still_show_on_stderr(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A warning shows by default, as one line on stderr, never on stdout."""
        get_logger("tests").warning("something.odd", partition=3)
        captured = capsys.readouterr()
        assert captured.out == ""
        assert "something.odd" in captured.err
        assert "partition=3" in captured.err
        assert captured.err.count("\n") == 1

    def test_default_config(self) -> None:
        """The default is warnings and errors, on the console."""
        assert current_log_config() == LogConfig(logging.WARNING, "console")


class TestConfigure:
    def test_configure_logging_turns_info_on(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """configure_logging(level="info") shows the store's events, on stderr."""
        configure_logging(level="info")
        commit_once(tmp_path)
        captured = capsys.readouterr()
        assert captured.out == ""
        assert "state_store.load" in captured.err
        assert "state_store.commit" in captured.err

    def test_a_logger_made_before_follows_a_later_configuration(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A logger created before configure_logging follows the new level."""
        log = get_logger("tests", partition=1)
        log.info("before")
        configure_logging("debug")
        log.debug("after")
        err = capsys.readouterr().err
        assert "before" not in err
        assert "after" in err

    def test_env_var_turns_info_on(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """RELSTATE_LOG=info shows the store's INFO events."""
        monkeypatch.setenv("RELSTATE_LOG", "info")
        commit_once(tmp_path)
        assert "state_store.commit" in capsys.readouterr().err

    def test_code_wins_over_env_var(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """configure_logging's arguments win; what it leaves out comes from RELSTATE_LOG."""
        monkeypatch.setenv("RELSTATE_LOG", "debug,json")
        config = configure_logging(level="error")
        assert config == LogConfig(logging.ERROR, "json")

    def test_json_format_is_one_json_object_a_line(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """RELSTATE_LOG=info,json writes each event as one JSON object with level and timestamp."""
        monkeypatch.setenv("RELSTATE_LOG", "info,json")
        commit_once(tmp_path)
        events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
        commit = next(e for e in events if e["event"] == "state_store.commit")
        assert commit["level"] == "info"
        assert commit["operator"] == "op" and commit["partition"] == 0
        assert commit["numTotalStateRows"] == 1
        assert commit["timestamp"].endswith("Z")
        assert commit["logger"] == "statestore._store"

    @pytest.mark.parametrize(
        ("spec", "expected"),
        [
            ("", LogConfig()),
            ("info", LogConfig(logging.INFO, "console")),
            ("info,json", LogConfig(logging.INFO, "json")),
            (" JSON , Debug ", LogConfig(logging.DEBUG, "json")),
            ("error", LogConfig(logging.ERROR, "console")),
        ],
    )
    def test_parse(self, spec: str, expected: LogConfig) -> None:
        """RELSTATE_LOG's words: a level and/or a format, in any order and case."""
        assert LogConfig.parse(spec) == expected

    def test_unknown_words_are_refused_in_code(self) -> None:
        """An unknown level or format given in code raises LogConfigError (also a ValueError)."""
        with pytest.raises(LogConfigError, match="unknown log level 'loud'"):
            configure_logging(level="loud")
        with pytest.raises(ValueError, match="unknown log format 'xml'"):
            configure_logging(format="xml")
        with pytest.raises(LogConfigError, match="unknown word 'verbose'"):
            LogConfig.parse("info,verbose")

    def test_a_bad_env_var_warns_and_keeps_the_default(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A bad RELSTATE_LOG does not fail anything: one warning, then the default."""
        monkeypatch.setenv("RELSTATE_LOG", "chatty")
        assert current_log_config() == LogConfig()
        assert current_log_config() == LogConfig()
        err = capsys.readouterr().err
        assert err.count("relstate.log_config_invalid") == 1
        assert "chatty" in err


class TestWorker:
    def test_pickled_config_applies_in_a_worker(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The driver's configuration, pickled (as in a task's plan) and applied, turns a
        quiet process's events on; apply_log_config(None) goes back to the default."""
        configure_logging("info", "json")
        shipped = pickle.dumps(current_log_config())
        apply_log_config(None)  # the worker: nothing configured
        commit_once(tmp_path / "quiet")
        assert capsys.readouterr().err == ""
        apply_log_config(pickle.loads(shipped))
        commit_once(tmp_path / "loud")
        events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
        assert {"state_store.load", "state_store.commit"} <= {e["event"] for e in events}


class TestCapture:
    def test_capture_sees_every_level_and_prints_nothing(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """capture_events collects events of every level, quiet or not, and shows none."""
        log = get_logger("tests", partition=2)
        with capture_events() as events:
            log.debug("d", n=1)
            log.warning("w")
        assert [(e["event"], e["log_level"]) for e in events] == [("d", "debug"), ("w", "warning")]
        assert events[0]["partition"] == 2 and events[0]["n"] == 1
        assert capsys.readouterr().err == ""
