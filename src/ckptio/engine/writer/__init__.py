"""The writer process of one rank: everything between a staged slot and a committed step.

``process`` is the entry point and message loop; ``pipeline`` runs each save job: its shared part (``first_tier``
serializes the slot into data files on the local tier, else the durable root) and then one object per level the
save goes to, each owning its tier, its committer and its failure rule: ``durable_level`` (upload, rank index,
commit) and ``local_level`` (partner copies, rank index, commit; two-level jobs only). ``level_outcome`` is the one
place a save attempt ends on a level (marker, deletion, message); ``step_committer`` is the one commit protocol
both levels use; ``local_tier`` owns ``local_dir`` and every deletion in it; ``live_steps`` keeps cleanup away from
what a save may be writing; ``flushes`` and ``flush_pacer`` run and pace the writes; ``dcp_metadata`` builds
``.metadata`` (rank 0 only: the one torch import).

Nothing here imports the trainer's or the restore's modules, touches the training process group, or deletes a
committed step outside retention's rules.
"""
