"""The engine: everything that runs a save or a restore on a rank, in three rooms and what they share.

* ``trainer/``: the training process's side. The :class:`~ckptio.engine.trainer.checkpointer.Checkpointer` API,
  the staging slots and the copy into them, the per-save decisions, the bookkeeping of saves in flight, the
  process-wide hooks, and the proxy that feeds the writer process.
* ``writer/``: the writer process of one rank (``python -m ckptio.engine.writer FD NICE``): the job pipeline
  (slot → data files → tiers → rank index), each level's writer and committer, the local tier, the flush pace.
  It never imports the trainer's or the restore's modules, and only rank 0's writer ever imports torch.
* ``restore/``: restore on the training process: choose the step, plan who reads which ranges, read, verify and
  exchange them, land them in the targets; two-level sources on top.

Shared by the rooms: ``protocol`` (every trainer↔writer message), ``side_group`` (the only collectives, on a
dedicated gloo group), ``owner_record`` (one job per root), ``process_hooks`` (every process-wide hook: the one
SIGTERM owner, the exit hook, the fork handlers, the writer's signal policy), and ``partner/`` (the
writer-to-writer channel of the local level, also read by a two-level restore).
"""
