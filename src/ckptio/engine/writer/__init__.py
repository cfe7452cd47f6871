"""The writer process of one rank: everything between a staged slot and a committed step.

``process`` is the entry point and message loop; ``pipeline`` runs each save job (serialize the slot into data
files, write the first tier, upload, write the rank index) and hands it to the levels; ``step_committer`` is the
one commit protocol both levels use; ``local_level_writer`` copies a local-level save to partner nodes;
``local_tier`` owns ``local_dir``; ``live_steps`` keeps cleanup away from what a save may be writing;
``flush_pacer`` paces the writes; ``dcp_metadata`` builds ``.metadata`` (rank 0 only: the one torch import).

Nothing here imports the trainer's or the restore's modules, touches the training process group, or deletes a
committed step outside retention's rules.
"""
