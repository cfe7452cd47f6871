"""A tiny Hugging Face training job run three ways (uninterrupted; stopped after a checkpoint; resumed), shared by
the one-process test and the torchrun worker. Everything is built from configs: nothing is downloaded."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback, TrainingArguments

from ckptio.integrations.hf import CkptioTrainer
from ckptio.testing.staging import hold_staging

MAX_STEPS, SAVE_STEPS, STOP_AT = 10, 4, 4  # 6 batches per epoch: the resume lands mid-epoch, then crosses one


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         attention_dropout=0.1)  # dropout: the RNG state matters to the loss
    return LlamaForCausalLM(config)


def dataset(world_size: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (24 * world_size, 16), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


class _StopAfterCheckpoint(TrainerCallback):
    """The checkpoint of step STOP_AT is copied into staging 0.3 s late, while step STOP_AT + 1 runs, and training
    ends right after that step: a preemption, minus the kill. Keeps the parameters as saved, to compare."""

    def __init__(self) -> None:
        self.trainer: Any = None  # set once the Trainer exists: its checkpointer may be built from a root
        self.params: dict[str, torch.Tensor] = {}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == STOP_AT:  # the Trainer saves right after this hook
            hold_staging(self.trainer.checkpointer, 0.3)
            self.params = {k: v.detach().clone() for k, v in kwargs["model"].state_dict().items()}
        if state.global_step == STOP_AT + 1:
            control.should_training_stop = True
        return control


class RecordingTrainer(CkptioTrainer):
    """Records the exact loss of every training step, keyed by the global step it belongs to."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.losses: dict[int, float] = {}

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = super().training_step(model, inputs, *args, **kwargs)
        self.losses[self.state.global_step + 1] = loss.detach().item()
        return loss


def trainer(ck: Any, out_dir: str, *, save: bool, stop: bool = False, world_size: int = 1) -> RecordingTrainer:
    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=4, max_steps=MAX_STEPS, learning_rate=1e-2,
        lr_scheduler_type="linear", warmup_steps=2, save_strategy="steps" if save else "no", save_steps=SAVE_STEPS,
        logging_steps=1, report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
        ddp_backend="gloo" if world_size > 1 else None,
    )
    stopper = _StopAfterCheckpoint()
    job = RecordingTrainer(model=tiny_llama(), args=args, train_dataset=dataset(world_size), checkpointer=ck,
                           callbacks=[stopper] if stop else None)
    stopper.trainer = job
    return job


def three_runs(ck: Any, out_dir: str, world_size: int = 1) -> dict[str, Any]:
    """Uninterrupted run; a run stopped one step after the step-4 checkpoint; a resumed run. Returns what to
    compare."""
    ref = trainer(ck, out_dir, save=False, world_size=world_size)
    ref.train()
    stopped = trainer(ck, out_dir, save=True, stop=True, world_size=world_size)
    stopped.train()
    stopper = next(cb for cb in stopped.callback_handler.callbacks if isinstance(cb, _StopAfterCheckpoint))
    stopped_params = stopper.params
    resumed = trainer(ck, out_dir, save=True, world_size=world_size)
    resumed.train(resume_from_checkpoint=True)
    return {
        "ref_losses": ref.losses,
        "stopped_losses": stopped.losses,
        "resumed_losses": resumed.losses,
        "same_params": all(torch.equal(a, b) for a, b in
                           zip(ref.model.state_dict().values(), resumed.model.state_dict().values(), strict=True)),
        "resumed_global_step": resumed.state.global_step,
        "world_size": resumed.args.world_size,
        "distributed_type": resumed.accelerator.distributed_type.value,
        "resumed_log_steps": [e["step"] for e in resumed.state.log_history if "loss" in e],
        "stopped_params": stopped_params,
    }
