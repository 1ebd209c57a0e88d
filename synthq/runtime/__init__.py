"""Runtime: processes and threads, memory, optimizers, console output, errors and paths, and the
content digests of files and trees (``file_digests``, ``hashing``) that every layer above reads."""
