"""The S3 backend: a key prefix in a bucket of S3 or an S3-protocol store.

``s3_storage`` is the backend (:class:`~ckptio.storage.s3.s3_storage.S3Storage`); ``options`` holds its options
and which failures are worth a retry; ``parts`` cuts uploads into parts within S3's limits; ``ranged_read`` reads
byte ranges straight into the caller's buffers; ``conditions`` says what a failed conditional write means;
``bucket`` reads where the bucket's bytes live and who can read them. boto3 is imported only here.
"""
