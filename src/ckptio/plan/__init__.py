"""Know before you train: what a job's checkpoints cost on a store, and whether it may start.

Four subpackages, each a different kind of thing:

* :mod:`~ckptio.plan.job` — what one checkpoint of a job holds: bytes, files and requests per rank, from the job's
  description alone (and the MLPerf Storage presets). No store, no time.
* :mod:`~ckptio.plan.costs` — the closed-form cost models: the burst budget on a store, what each save mode costs
  the training step, the intervals, the two-level model. Pure arithmetic on their inputs: never measures.
* :mod:`~ckptio.plan.simulation` — the same questions answered event by event (the burst simulator, failure
  injection), to check the closed forms where they assume too much.
* :mod:`~ckptio.plan.measure` — measurements of this host and of a store (the probe, the writers' per-byte costs,
  the disk, a trial save): they produce the models' inputs and decide nothing.

Beside them, :mod:`~ckptio.plan.units` (the quantities every command reads and prints) and :mod:`~ckptio.plan.admit`
(the admission gate, built on the budget). Imports go one way: ``job`` ← ``costs`` ← ``simulation``; ``measure``
may build the models' input types, and no model imports ``measure``.
"""
