"""The POSIX backend: a directory on a local disk, a RAM disk or a parallel filesystem.

``posix_storage`` is the backend (:class:`~ckptio.storage.posix.posix_storage.PosixStorage`); ``direct_io``
writes and reads large objects around the page cache (``O_DIRECT``); ``writeback`` makes a paced write through the
page cache reach the disk at its pace.
"""
