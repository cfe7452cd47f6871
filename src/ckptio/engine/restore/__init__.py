"""Restore, on the training process: read a committed step back into the caller's state, at any world size.

``step_restore`` chooses the step every rank loads and runs DCP's load planner through ``storage_reader`` (the
DCP StorageReader). ``read_plan`` decides, on DCP's coordinator, who reads which byte ranges (each once across
ranks) and who receives them; ``transfer`` reads a rank's share, checks every checksum block and exchanges ranges
on the side group; ``destinations`` says where the bytes land (straight into a target tensor when it can).
``two_level_restore`` adds the local level's sources: this rank's own copy, a partner's, then the durable root.
"""
