"""``ckptio``'s exit codes: documented in ``--help``, and an unexpected exception is reported as a bug (exit 3) in
one line — never a traceback, never dressed up as a usage error."""

from __future__ import annotations

import argparse

import pytest

from ckptio._cli import plan_cmd
from ckptio._cli.main import EXIT_INTERNAL, TRACEBACK_ENV, main


def test_help_documents_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("0 success", "1 a finding", "2 usage error", "3 internal error", "130 interrupted"):
        assert text in out


def test_an_unexpected_exception_is_an_internal_error_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No real input is known to reach this net any more (the hostile battery guards that), so a command that
    # fails the way a bug would stands in for one: the net is what is under test.
    def broken(args: argparse.Namespace) -> int:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(plan_cmd, "run", broken)
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    assert main(["plan", "--params", "8B", "--write-bandwidth", "1GB/s"]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("ckptio plan: internal error: ZeroDivisionError: float division by zero")
    assert "bug" in err and TRACEBACK_ENV in err
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    assert main(["plan", "--params", "8B", "--write-bandwidth", "1GB/s"]) == EXIT_INTERNAL
    assert "Traceback" in capsys.readouterr().err
