"""Restore, on the training process: read a committed step back into the caller's state, at any world size.

``context`` holds what one restore works with, as values (``RestoreContext``: stores, side group, ``ReadOptions``,
the ``LocalLevel`` of a two-level job). ``step_restore`` chooses the step every rank loads (a committed one, or a
plain DCP checkpoint) and runs DCP's load planner through ``storage_reader`` (the DCP StorageReader), behind the
``readiness`` gate (a rank that cannot start fails every rank within a bound) and the one ``dcp_load`` wrapper that
turns DCP's failures into ckptio's. ``step_layout`` is the coordinator's view of the stored bytes, every claim
checked against the store before memory is spent; ``read_plan`` decides who reads which byte ranges (each once
across ranks) and who receives them; ``transfer`` reads a rank's share, checks every checksum block and exchanges
ranges through ``peer_links`` (a rank found gone is ``PeerLostError``); ``destinations`` says where the bytes land
(straight into a target tensor when it can), and ``stored_blob`` turns a gathered item's stored bytes into the blob
``torch.load`` reads (DCP stream extensions undone, plain DCP's zip CRC-32 checked). ``two_level_restore`` adds the
local level's sources through ``levels_storage_reader``: this rank's own copy, a partner's, then the durable root;
``early_push`` sends a lost node's files back to it from their partner copies while rank 0 still chooses the step.
"""
