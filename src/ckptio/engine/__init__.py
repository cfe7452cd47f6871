"""The engine: everything that runs a save or a restore on a rank.

``checkpointer`` (the training thread's API) → ``staging`` (host slots) → ``writer_proxy`` → the writer process
(``writer`` runs the job pipeline, ``committer`` the commit) → ``storage``. ``protocol`` defines every message
between the trainer and its writer; ``group`` holds the only collectives; ``dcp`` plans with DCP and reads back.
"""
