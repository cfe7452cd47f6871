"""The engine: everything that runs a save or a restore on a rank.

``checkpointer`` (the training thread's API) → ``staging`` (host slots) → ``writer_proxy`` → the writer process
(``writer`` runs the job pipeline, ``committer`` the commit) → ``storage``. ``protocol`` defines every message
between the trainer and its writer; ``group`` holds the only collectives (the restore's exchange of ranges between
ranks runs on the same side group); ``dcp`` plans saves with DCP. Restore: ``restore`` picks the step, ``reader`` is
the DCP StorageReader, ``readplan`` decides who reads which ranges, ``transfer`` reads, checks and exchanges them,
``targets`` says where they land; ``sources`` adds the two-level sources.
"""
