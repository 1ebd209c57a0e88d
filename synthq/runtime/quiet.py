"""Library noise on stderr quieted as synthq's own lines replace it: Hugging Face progress bars
and advice (transformers, huggingface_hub, datasets), and library warnings as one synthq line.

The command line quiets it for the whole process (:func:`quiet_process`, from the app's
callback unless ``-v``; :func:`one_line_warning` installed by ``synthq.cli.errors.main``). The
Python API quiets it around each stage it runs (:func:`quiet_libraries`) and gives the caller's
state back afterwards: a notebook's own transformers calls keep their progress bars.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator

from synthq.runtime.console import console, verbosity

# read by the libraries (and tqdm) when they are first imported
QUIET_ENVIRONMENT = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    # bars that libraries draw with tqdm directly (transformers' GGUF conversion) would write
    # carriage returns into every non-terminal log
    "TQDM_DISABLE": "1",
}


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Library warnings as one synthq line (deprecations only with -v): a ``warnings.showwarning``."""
    from rich.markup import escape

    if issubclass(category, DeprecationWarning | FutureWarning) and verbosity() < 2:
        return
    first = str(message).strip().splitlines()[0] if str(message).strip() else category.__name__
    console.print(f"[bold yellow]warning:[/] {escape(first)} [dim]({category.__name__})[/]", highlight=False)


def quiet_process() -> None:
    """No progress bars or advice from Hugging Face libraries for the rest of the process (the
    command line: synthq reports progress itself); what the user's environment sets is kept."""
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if "transformers" in sys.modules:  # already imported (tests, notebooks): switch it off there
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        transformers_logging.set_verbosity_error()


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Around one stage run from Python: the command line's quiet (Hugging Face progress bars and
    advice off, library warnings as one line), the previous state of each restored afterwards.
    With verbosity 2 (``-v``'s level) nothing is quieted, as on the command line.

    The libraries are imported here, before their state is read (about a second, once a process;
    a stage that runs a model imports them anyway), so that what is restored is what they had."""
    if verbosity() >= 2:
        yield
        return
    from datasets.utils.tqdm import are_progress_bars_disabled as datasets_bars_disabled
    from datasets.utils.tqdm import disable_progress_bars as disable_datasets_bars
    from datasets.utils.tqdm import enable_progress_bars as enable_datasets_bars
    from huggingface_hub import utils as hub
    from transformers.utils import logging as transformers_logging

    environment = {name: os.environ.get(name) for name in QUIET_ENVIRONMENT}
    hub_bars = not hub.are_progress_bars_disabled()
    datasets_bars = not datasets_bars_disabled()
    transformers_bars = transformers_logging.is_progress_bar_enabled()
    transformers_level = transformers_logging.get_verbosity()
    showwarning = warnings.showwarning
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    hub.disable_progress_bars()
    if datasets_bars:
        disable_datasets_bars()
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    warnings.showwarning = one_line_warning
    try:
        yield
    finally:
        warnings.showwarning = showwarning
        transformers_logging.set_verbosity(transformers_level)
        if transformers_bars:
            transformers_logging.enable_progress_bar()
        if datasets_bars:
            enable_datasets_bars()
        if hub_bars:
            hub.enable_progress_bars()
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
