"""Glue between ckptio and the stacks people train with.

One module per stack, each imported only by users of that stack (they import their stack at the top)::

    ckptio.integrations.torch      AppState: one Stateful for model(s), optimizer(s), scheduler(s), RNG, extras
    ckptio.integrations.hf         CkptioTrainer / CkptioTrainerMixin for the Hugging Face Trainer (and Accelerate)
    ckptio.integrations.lightning  CkptioCheckpoint: a Lightning Callback, resume with trainer.fit(ckpt_path=...)
    ckptio.integrations.torchtitan CkptioCheckpointManager: a torchtitan checkpoint manager backend

This package owns only the mapping of each stack's state and hooks onto ``Checkpointer.save``/``restore``. It must
never reach into ckptio's engine (only the public ``Checkpointer`` API) and never import a third-party stack here:
importing ``ckptio.integrations`` costs nothing.
"""
