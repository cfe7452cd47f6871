"""The trainer's side of a save: what runs in the training process, on the training thread or beside it.

A save flows ``checkpointer`` (the API) → ``save_launcher`` (one save on the training thread) → ``step_rules`` (the
step's own checks) → ``save_decision`` (the request, the collective agreement of a planning save) → ``plan_cache``
(the state's flat form; the plan of its structure, made by ``rank_plan``'s DCP planning once per structure) →
``staging_area`` (the reusable slots) → ``stager`` (the copy off the training thread; ``staging_guard`` makes the
first mutation wait for it) → ``writer_proxy`` (the writer process). ``save_tracker`` keeps the saves in flight
and their ``save_handle``s; ``maybe_save_votes`` agrees time-based and preemption decisions without blocking;
``pace_rule`` sets each flush's rate; ``save_levels`` says where a save goes and where a restore comes from;
``preflight`` opens the roots and checks the durable one before the first byte; ``exit_guard`` closes a Checkpointer
left open at exit. The process-wide hooks (SIGTERM, exit, fork) are ``engine.process_hooks``'s, shared with the
writer.
"""
