"""``ckptio --help`` speaks to users: what ckptio is and its commands, not the developer docstring."""

from __future__ import annotations

import pytest

from ckptio._cli.main import build_parser, main


def test_help_says_what_ckptio_is_and_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "ckptio keeps checkpoint I/O bursts off the training critical path" in out
    for command in ("ls", "verify", "plan", "probe", "admit", "simulate", "report", "demo"):
        assert f"    {command} " in out, command
    assert "register(" not in out and "``" not in out  # no developer docstring leaks into the help


def test_every_command_parses() -> None:
    parser = build_parser()
    assert parser.parse_args(["ls", "/tmp/x"]).func.__module__ == "ckptio._cli.steps_cmd"
