"""The planner's closed-form cost models: the burst budget, each save mode's cost to the step, the intervals, the
two-level model. They only compute on the values they are given: measuring is :mod:`ckptio.plan.measure`'s."""
