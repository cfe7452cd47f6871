"""Lightning on ckptio: bit-exact resume through trainer.fit(ckpt_path=...) from a mid-epoch checkpoint and from
epoch-end ones (step-based and epoch-based training), on one process and with strategy="ddp" on two (torchrun,
gloo); plain ``dcp.load`` of the two-rank checkpoint in one process."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptio
from ckptio.errors import CheckpointNotFoundError, ConfigError
from ckptio.integrations.lightning import LIGHTNING_KEY, CkptioCheckpoint
from ckptio.integrations.torch import AppState

from .launch import torchrun
from .lightning_common import CASES, EPOCH_END, MAX_STEPS, TinyModule, fit, resume_runs


def _check_bit_exact(result: dict) -> None:
    for case, (_, max_epochs, stop, _, _) in CASES.items():
        if case not in result:
            continue
        runs = {k: ({int(s): v for s, v in v.items()} if isinstance(v, dict) else v) for k, v in result[case].items()}
        ref = runs["ref"]
        total = max_epochs * 6 if max_epochs else MAX_STEPS
        assert sorted(ref) == list(range(1, total + 1))
        assert runs["stopped"] == {s: ref[s] for s in range(1, stop + 2)}  # one step past the checkpoint
        # Exact float equality at every step after the resume.
        assert runs["resumed"] == {s: ref[s] for s in range(stop + 1, total + 1)}, case
        assert runs["resumed_epochs"] == {s: runs["ref_epochs"][s] for s in range(stop + 1, total + 1)}, case
        assert runs["same_params"], case
    if "mid_epoch" in result:
        # Committed: 4 and 8 (mid-epoch case: stopped, then resumed), 6 (epoch end), 12 (epoch-based).
        assert result["newest"] == ("ckptio:12" if "epoch_based" in result else "ckptio:8")


def test_fit_resume_is_bit_exact_on_one_process(tmp_path):
    with ckptio.Checkpointer(str(tmp_path / "ck"), keep_last=0) as ck:
        result = resume_runs(ck, str(tmp_path / "out"))
        with pytest.raises(CheckpointNotFoundError):
            fit(1, str(tmp_path / "out"), [CkptioCheckpoint(ck)], ckpt_path="ckptio:5")
    _check_bit_exact(result)


def test_a_step_checkpoint_on_an_epochs_last_batch_resumes_bit_exact_in_the_next_epoch(tmp_path):
    """every_n_train_steps = the epoch's length: the checkpoint is taken after the epoch's last batch, before its
    end, with the loader's (exhausted) position in it. Lightning alone resumes it one epoch ahead."""
    with ckptio.Checkpointer(str(tmp_path / "ck"), keep_last=0) as ck:
        result = resume_runs(ck, str(tmp_path / "out"), cases=("last_batch",))
    _check_bit_exact(result)
    runs = result["last_batch"]
    assert runs["ref_epochs"][EPOCH_END] == 0 and runs["resumed_epochs"][EPOCH_END + 1] == 1
    assert result["newest"] == f"ckptio:{EPOCH_END}"


def test_a_root_builds_the_checkpointer_in_setup_and_closes_it_at_teardown(tmp_path):
    ckpt = CkptioCheckpoint(str(tmp_path / "ck"), every_n_train_steps=2, checkpointer_options={"keep_last": 1})
    fit(1, str(tmp_path / "out"), [ckpt])  # MAX_STEPS steps, a save every 2
    assert ckpt._ck is None  # closed once fit ended, after the last save committed
    assert ckpt.resume_path() == f"ckptio:{MAX_STEPS}"
    assert [n for n in os.listdir(tmp_path / "ck") if n.startswith("step-")] == [f"step-{MAX_STEPS:08d}"]


def test_bad_options_and_paths(tmp_path):
    with pytest.raises(ConfigError):
        CkptioCheckpoint(str(tmp_path), every_n_train_steps=0)
    with pytest.raises(ConfigError):
        CkptioCheckpoint(object())
    assert CkptioCheckpoint(str(tmp_path / "none")).resume_path() is None


@pytest.mark.multiproc
@pytest.mark.slow
def test_fit_resume_is_bit_exact_with_ddp_on_two_processes_and_loads_on_one(tmp_path):
    root, out = str(tmp_path / "ck"), str(tmp_path / "out")
    torchrun(2, "lightning_worker.py", root, out)
    results = []
    for rank in range(2):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            results.append(json.load(f))
        _check_bit_exact(results[-1])
    assert results[0]["mid_epoch"]["ref"] != results[1]["mid_epoch"]["ref"]  # each rank trained on its own shard
    assert {"mid_epoch", "epoch_end", "last_batch"} <= set(results[0])

    # Written by two DDP processes through ckptio; read by one plain process with torch's own dcp.load.
    module = TinyModule(world_size=1)
    optimizer = torch.optim.AdamW(module.parameters())
    state = {"app": AppState(module, optimizer), LIGHTNING_KEY: b""}
    dcp.load(state, checkpoint_id=os.path.join(root, f"step-{EPOCH_END:08d}"))
    expected = torch.load(os.path.join(out, "stopped_params.pt"))
    assert all(torch.equal(v, expected[k]) for k, v in module.state_dict().items())
    assert int(optimizer.state[module.net[0].weight]["step"]) == EPOCH_END
    lightning_state = torch.load(io.BytesIO(state[LIGHTNING_KEY]), weights_only=False)
    assert lightning_state["global_step"] == EPOCH_END
    assert lightning_state["lr_schedulers"][0]["last_epoch"] == 1
