"""Runtime: processes and threads, memory, optimizers, console output, errors and paths."""
