"""Construction is checked and all or nothing.

A misspelled or mistyped option is a ConfigError naming it; a ``Checkpointer(...)`` that raises after claiming the
root leaves no root claim, bound metrics port, writer process, ``/dev/shm`` segment or open event file behind; a
closed checkpointer says so with its own error class.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import fields

import psutil
import pytest
import torch

import ckptio
from ckptio.config import CheckpointerConfig, CheckpointerOptions
from ckptio.engine.owner_record import OWNER_KEY
from ckptio.engine.trainer import preflight as preflight_module
from ckptio.engine.trainer.staging_area import SHM_DIR, SLOT_PREFIX
from ckptio.errors import CheckpointerClosedError, ConfigError


def test_a_misspelled_option_names_the_closest_valid_one(root):
    with pytest.raises(ConfigError, match="unknown option 'max_pendng'; did you mean 'max_pending'"):
        ckptio.Checkpointer(root, max_pendng=2)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="did you mean 'keep_last'"):
        CheckpointerConfig(root=root, keep_lsat=2)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"valid options: .*commit_timeout_s, data_dirs"):
        CheckpointerConfig(root=root, zzzz=1)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("max_pending", 1.5, "int"),
        ("keep_last", "3", "int"),
        ("max_pending", True, "int"),  # a bool is an int to Python, never a count to ckptio
        ("overflow", 1, "one of 'block', 'skip'"),
        ("fsync", "yes", "bool"),
        ("every_seconds", "60", "float | None"),
        ("data_dirs", "/data", "tuple[str, ...]"),  # one string would be read as a list of characters
        ("root", 3, "str | os.PathLike[str] | Storage"),
    ],
)
def test_an_option_of_the_wrong_type_is_refused_naming_option_type_and_value(root, option, value, expected):
    options = {"root": root, option: value}
    with pytest.raises(ConfigError) as info:
        ckptio.Checkpointer(**options)
    assert str(info.value) == f"{option} must be {expected}, got {value!r} ({type(value).__name__})"


def test_values_that_fit_the_annotation_are_accepted(tmp_path):
    np = pytest.importorskip("numpy")
    config = CheckpointerConfig(root=tmp_path, max_pending=np.int64(2), every_seconds=60, lease_s=0,
                                data_dirs=[tmp_path / "data"], overflow="skip")
    assert config.data_dirs == (str(tmp_path / "data"),)


def test_a_missing_root_or_a_positional_option_is_a_config_error(root):
    with pytest.raises(ConfigError, match="needs root"):
        CheckpointerConfig()  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="keyword options only"):
        CheckpointerConfig(root)  # type: ignore[misc]
    with pytest.raises(ConfigError, match="needs a root"):
        ckptio.Checkpointer()
    with pytest.raises(ConfigError, match="not both"):
        ckptio.Checkpointer(config=CheckpointerConfig(root=root), keep_last=1)


def test_the_typed_keyword_options_mirror_the_config_fields():
    # Checkpointer(root, **options: Unpack[CheckpointerOptions]): a field missing here is a keyword mypy refuses.
    annotations = {name: getattr(hint, "__forward_arg__", hint) for name, hint in
                   CheckpointerOptions.__annotations__.items()}
    config_fields = {f.name: f.type for f in fields(CheckpointerConfig)}
    assert set(annotations) | {"root"} == set(config_fields)
    assert CheckpointerOptions.__required_keys__ == frozenset()
    # data_dirs also takes a list (normalised to a tuple); every other option has the field's own type.
    assert {n: t for n, t in annotations.items() if n != "data_dirs"} == {
        n: t for n, t in config_fields.items() if n not in ("root", "data_dirs")
    }


def test_a_closed_checkpointer_raises_its_own_error_not_a_usage_error(root):
    ck = ckptio.Checkpointer(root, start_writer="on_first_save")
    ck.close()
    ck.close()  # a second close does nothing
    with pytest.raises(CheckpointerClosedError, match="closed") as info:
        ck.save(1, {"w": torch.ones(2)})
    assert not isinstance(info.value, ConfigError)
    assert info.value.root == ck.storage.url
    with pytest.raises(CheckpointerClosedError):
        ck.restore({"w": torch.zeros(2)})


# ---- all or nothing -------------------------------------------------------------------------------------------------
@pytest.fixture
def claims(monkeypatch):
    """Records each root claim the Checkpointer makes, to prove a failure came after it."""
    made = []
    real = preflight_module.claim_root

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(preflight_module, "claim_root", spy)
    return made


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_nothing_left(root: str, events_dir: str, children_before: set[int]) -> None:
    me = psutil.Process()
    assert _children() <= children_before, "a writer process outlived the failed construction"
    assert [f.path for f in me.open_files() if f.path.startswith(events_dir)] == []
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(f"{SLOT_PREFIX}{os.getpid()}-")] == []
    assert not os.path.exists(os.path.join(root, OWNER_KEY))
    # The root can be claimed again at once, by a job with another id and a live lease.
    with ckptio.Checkpointer(root, lease_s=60, start_writer="on_first_save") as again:
        assert again.latest_step() is None


def test_a_metrics_port_in_use_after_the_root_claim_leaves_nothing_behind(root, tmp_path, claims):
    events_dir = str(tmp_path / "events")
    before = _children()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            ckptio.Checkpointer(root, metrics_port=port, lease_s=60, events_path=os.path.join(events_dir, "ev.jsonl"))
    assert len(claims) == 1  # the failure came after the claim
    _assert_nothing_left(root, events_dir, before)


def test_a_writer_that_cannot_start_leaves_no_claim_port_or_file_behind(root, tmp_path, claims, monkeypatch):
    events_dir = str(tmp_path / "events")
    port = _free_port()
    before = _children()
    # The writer is the last step, after the claim and the metrics endpoint: make its interpreter missing.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(FileNotFoundError):
        ckptio.Checkpointer(root, metrics_port=port, lease_s=60, events_path=os.path.join(events_dir, "ev.jsonl"),
                            start_writer="on_init")
    monkeypatch.undo()
    assert len(claims) == 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the metrics endpoint is gone
    _assert_nothing_left(root, events_dir, before)
