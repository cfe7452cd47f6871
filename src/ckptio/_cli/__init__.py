"""The ``ckptio`` command."""
