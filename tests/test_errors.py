"""SPECLI_DEBUG has one meaning wherever it is read (`specli --debug` sets it): set to anything but "" or
"0", tracebacks are shown; the CLI's errors and serve's log lines ask the same function."""

from __future__ import annotations

import pytest

from specli.errors import debug_enabled
from specli.serve.server import OneLineLog


@pytest.mark.parametrize(("value", "on"), [(None, False), ("", False), ("0", False), ("1", True),
                                           ("yes", True)])
def test_specli_debug_means_one_thing(monkeypatch: pytest.MonkeyPatch, value: str | None, on: bool) -> None:
    if value is None:
        monkeypatch.delenv("SPECLI_DEBUG", raising=False)
    else:
        monkeypatch.setenv("SPECLI_DEBUG", value)
    assert debug_enabled() is on
    assert OneLineLog(lambda line: None).debug is on
