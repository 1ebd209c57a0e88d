"""``python -m synthq`` (and ``torchrun --nproc_per_node N -m synthq ...``) runs the CLI."""

from synthq.cli.errors import main

if __name__ == "__main__":
    main()
