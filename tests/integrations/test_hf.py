"""The Hugging Face Trainer on ckptio: a bit-exact resume (the same loss at every later step as an uninterrupted
run), on one process and on two under torchrun (DDP over gloo, as Accelerate sets it up), and plain ``dcp.load`` of
the two-rank checkpoint in one process."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from transformers import TrainerCallback

import ckptio
from ckptio.errors import ConfigError
from ckptio.integrations.hf import TRAINER_STATE_KEY, CkptioTrainer
from ckptio.integrations.torch import AppState

from .hf_common import MAX_STEPS, STOP_AT, three_runs, tiny_llama, trainer
from .launch import torchrun


def _check_bit_exact(result: dict) -> None:
    ref, resumed = result["ref_losses"], result["resumed_losses"]
    assert sorted(resumed) == list(range(STOP_AT + 1, MAX_STEPS + 1))
    assert resumed == {s: ref[s] for s in resumed}  # exact float equality, every step after the resume
    assert result["stopped_losses"] == {s: ref[s] for s in range(1, STOP_AT + 2)}  # one step past the checkpoint
    assert result["same_params"]
    assert result["resumed_global_step"] == MAX_STEPS
    # trainer_state came back: the log history runs on from the stopped run's.
    assert result["resumed_log_steps"] == list(range(1, MAX_STEPS + 1))


def test_trainer_resume_is_bit_exact_on_one_process(tmp_path):
    with ckptio.Checkpointer(str(tmp_path / "ck"), keep_last=0) as ck:
        result = three_runs(ck, str(tmp_path / "out"))
        assert ck.latest_step() == MAX_STEPS  # the Trainer's end-of-training save went through ckptio too
    _check_bit_exact(result)
    assert not any(name.startswith("checkpoint-") for name in os.listdir(tmp_path / "out"))


def test_unsupported_trainer_options_are_config_errors(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_only_model=True)
    with pytest.raises(ConfigError):
        CkptioTrainer(model=tiny_llama(), args=args, checkpointer=str(tmp_path / "ck"))
    with pytest.raises(ConfigError):
        trainer(object(), str(tmp_path), save=True)


@pytest.mark.multiproc
@pytest.mark.slow
def test_trainer_resume_is_bit_exact_on_two_processes_and_loads_on_one(tmp_path):
    root, out = str(tmp_path / "ck"), str(tmp_path / "out")
    torchrun(2, "hf_worker.py", root, out)
    results = []
    for rank in range(2):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            result = json.load(f)
        result = {k: ({int(s): v for s, v in result[k].items()} if k.endswith("losses") else result[k])
                  for k in result}
        assert (result["world_size"], result["distributed_type"]) == (2, "MULTI_CPU")
        _check_bit_exact(result)
        results.append(result)
    assert results[0]["ref_losses"] != results[1]["ref_losses"]  # each rank trained on its own shard

    # Written by two DDP processes through ckptio; read by one plain process with torch's own dcp.load.
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters())
    state = {"app": AppState(model, optimizer), TRAINER_STATE_KEY: ""}
    dcp.load(state, checkpoint_id=os.path.join(root, f"step-{STOP_AT:08d}"))
    expected = torch.load(os.path.join(out, "stopped_params.pt"))
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    assert json.loads(state[TRAINER_STATE_KEY])["global_step"] == STOP_AT
    assert int(optimizer.state[model.lm_head.weight]["step"]) == STOP_AT

    # The same checkpoint resumed by the Trainer in one process: the RNG states saved for rank 0 come back (rank 1's
    # stay unused; in this job both ranks drew alike, so this shows they were restored, not whose they were).
    saved_rng = state["app"].restored_rng  # what dcp.load just read for rank 0
    at_start = _StateAtTrainBegin()
    resumed = trainer(root, str(tmp_path / "out1"), save=False)
    resumed.add_callback(at_start)
    resumed.train(resume_from_checkpoint=STOP_AT)
    assert resumed.state.global_step == MAX_STEPS
    assert all(torch.equal(v, expected[k]) for k, v in at_start.params.items())
    assert torch.equal(at_start.rng, saved_rng["torch"])


class _StateAtTrainBegin(TrainerCallback):
    """The parameters and torch's RNG state once the resume loaded them, before the first step."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.params = {k: v.detach().clone() for k, v in kwargs["model"].state_dict().items()}
        self.rng = torch.get_rng_state()


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_resume_at_a_larger_world_size_is_refused_on_every_rank(tmp_path):
    """Each rank's RNG states are saved under its rank (see docs/integrations.md): a rank the checkpoint never had
    has none, and the resume stops with StructureMismatchError on every rank before training."""
    root = str(tmp_path / "ck")
    trainer(root, str(tmp_path / "out"), save=True, stop=True).train()  # one process, checkpoint of step STOP_AT
    torchrun(2, "hf_resize_worker.py", root, str(tmp_path / "out2"))
    for rank in range(2):
        with open(tmp_path / "out2" / f"rank{rank}.json") as f:
            outcome = json.load(f)
        assert outcome["error"] == "StructureMismatchError", outcome
        assert "app.ranks.1.rng" in outcome["message"]
