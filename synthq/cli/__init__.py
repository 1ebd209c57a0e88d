"""The ``synthq`` command line: one thin command per stage (options -> config -> stage.run).

A command's options are derived from its config model (:mod:`synthq.cli.options`): each option's
name, help, default, choices and valid range are written once, in :mod:`synthq.config`.

- :mod:`synthq.cli.app`: the Typer app, its global options, every command registered
- :mod:`synthq.cli.options`: options generated from config fields
- :mod:`synthq.cli.stage_commands`: one command per stage
- :mod:`synthq.cli.inspect_commands`: info, ledger, key, export, data info
- :mod:`synthq.cli.search_command`: ``synthq search``
- :mod:`synthq.cli.run_command`: ``synthq run`` (pipelines)
- :mod:`synthq.cli.errors`: :func:`main`, the entry point: errors as one line and an exit status

``synthq.cli:main`` is the console script, hence the one name imported here.
"""

from synthq.cli.errors import main

__all__ = ["main"]
