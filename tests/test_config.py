"""Every float option of every config dataclass refuses NaN and the infinities, naming the option.

NaN passes every range check (``lease_s < 0`` is false for it): ``lease_s=nan`` with ``commit="lease"`` used to
switch the ownership lease off, and two jobs then opened one root. The cases are drawn from the dataclasses' own
fields, so a float option added later is covered without touching this file.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptio
from ckptio.config import CheckpointerConfig, WriterConfig
from ckptio.errors import ConfigError
from ckptio.storage.s3.options import S3Options

NON_FINITE = [math.nan, math.inf, -math.inf, np.float64("nan")]
CONFIGS: tuple[type, ...] = (CheckpointerConfig, WriterConfig, S3Options)


def float_fields(cls: type) -> list[str]:
    """The fields whose annotation admits a float (``float``, ``float | None``, …)."""
    return [f.name for f in dataclasses.fields(cls) if re.search(r"\bfloat\b", str(f.type))]


CASES = [(cls, name) for cls in CONFIGS for name in float_fields(cls)]


def build(cls: type, root: Path, **changes: Any) -> Any:
    """A valid instance of ``cls`` with ``changes`` applied (``__post_init__`` runs on it)."""
    if cls is CheckpointerConfig:
        return CheckpointerConfig(root=str(root), **changes)
    if cls is WriterConfig:
        return dataclasses.replace(CheckpointerConfig(root=str(root)).writer_config(), **changes)
    return cls(**changes)


def test_the_cases_cover_the_known_float_options():
    # Guards the parametrization against going quietly empty (an annotation written another way).
    names = {name for _, name in CASES}
    assert {"lease_s", "every_seconds", "commit_timeout_s", "residency_recheck_s", "close_timeout_s",
            "preempt_grace_s", "partner_timeout_s", "retry_base_s", "retry_cap_s", "connect_timeout_s",
            "read_timeout_s"} <= names
    assert {cls for cls, _ in CASES} == set(CONFIGS)


@pytest.mark.parametrize(("cls", "name"), CASES, ids=[f"{cls.__name__}.{name}" for cls, name in CASES])
@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf", "np.nan"])
def test_a_non_finite_float_option_is_refused_by_name(tmp_path, cls, name, value):
    with pytest.raises(ConfigError, match=rf"^{name} must be a finite number, got "):
        build(cls, tmp_path, **{name: value})


@pytest.mark.parametrize(("cls", "name"), CASES, ids=[f"{cls.__name__}.{name}" for cls, name in CASES])
def test_a_finite_value_still_passes(tmp_path, cls, name):
    # The finiteness rule must not refuse what the range checks accept (an int counts as a float option).
    whole, fraction = FINITE_VALUES.get(name, (30, np.float64(45.5)))
    build(cls, tmp_path, **{name: whole})
    build(cls, tmp_path, **{name: fraction})


# Options whose range a whole number of seconds does not fit.
FINITE_VALUES = {"flush_pace_fraction": (1, np.float64(0.25))}


def test_checkpointer_with_a_nan_lease_refuses_before_writing_anything(tmp_path):
    root = tmp_path / "root"
    with pytest.raises(ConfigError, match="lease_s must be a finite number, got nan"):
        ckptio.Checkpointer(str(root), lease_s=float("nan"), commit="lease")
    assert not root.exists()
    with pytest.raises(ConfigError, match="commit_timeout_s must be a finite number, got inf"):
        ckptio.Checkpointer(str(root), commit_timeout_s=float("inf"))
    assert not root.exists()


def test_s3_storage_options_refuse_nan(tmp_path):
    pytest.importorskip("boto3")
    from ckptio.storage import open_storage

    with pytest.raises(ConfigError, match="read_timeout_s must be a finite number"):
        open_storage("s3://bucket/run", read_timeout_s=float("nan"))


def test_the_writer_niceness_defaults_to_10_or_the_environment_and_an_argument_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("CKPTIO_WRITER_NICE", raising=False)
    assert CheckpointerConfig(root=str(tmp_path)).writer_nice == 10
    monkeypatch.setenv("CKPTIO_WRITER_NICE", "3")
    assert CheckpointerConfig(root=str(tmp_path)).writer_nice == 3
    assert CheckpointerConfig(root=str(tmp_path), writer_nice=7).writer_nice == 7


@pytest.mark.parametrize("value", ["ten", "20", "-1", "1.5"])
def test_a_bad_writer_niceness_in_the_environment_is_named(tmp_path, monkeypatch, value):
    monkeypatch.setenv("CKPTIO_WRITER_NICE", value)
    with pytest.raises(ConfigError, match="CKPTIO_WRITER_NICE"):
        CheckpointerConfig(root=str(tmp_path))
