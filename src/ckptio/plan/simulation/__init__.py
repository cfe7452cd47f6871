"""The planner's questions answered event by event: the burst simulator and failure injection, each checking a
closed-form model of :mod:`ckptio.plan.costs` where it assumes too much."""
