"""Mixed precision: bf16 autocast for forward passes, fp32 for everything DP computes.

``--precision auto|bf16|fp32`` (every stage that runs a model). ``auto`` is bf16 on a CUDA GPU
that supports it and fp32 everywhere else; ``bf16`` may also be asked for on a CPU (torch's CPU
autocast: slower on CPUs without bf16 arithmetic, faster on those with it — on an AMD EPYC
with AVX512-BF16, measured alone, generation 0.55× and a DP step of SmolLM2 + LoRA 0.62× fp32's
time, MiniLM's retriever step 1.04×: ``benchmarks/cpu_precision.py``, docs/performance.md — and how
the tests check the bf16 path without a GPU). ``auto`` stays fp32 on a CPU so that
a run's figures do not depend on which CPU ran it.

What bf16 changes, and what it does not:

* **Forward passes only** run under ``torch.autocast(dtype=bfloat16)``
  (:func:`forward_autocast`): matrix products in bf16, while autocast keeps softmax, norms and
  losses in fp32. The weights stay fp32 (master weights); their gradients are fp32.
* **DP arithmetic is fp32.** The per-example (per-user, per-group) gradient norms, the clip
  factors, the clipped sums and the noise are computed in fp32 outside autocast
  (:func:`full_precision`; :func:`as_fp32` for activations and output gradients recorded in
  bf16 by the clipping hooks). A per-example gradient formed from bf16 activations is a
  different vector from the fp32 one, but the norm that clips it is the norm *of that vector*,
  computed in fp32, and the clipped sum is formed from the same records: each example
  contributes at most ``C`` exactly as in fp32, so the sensitivity, the noise and the
  accountant's inputs (σ, q, steps) do not change. ``tests/dp/test_precision.py`` checks the norms
  against the fp32 micro-batch ground truth and the bound by brute force.

The stage sets the precision once for its run (:func:`use_precision`, or the :func:`stage`
decorator); forward passes read it (:func:`forward_autocast`) and the manifest records it
(:func:`current`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that need it: `synthq search` reads the stage state
# (no stage: nothing to do) on its torch-free ONNX path.
PRECISIONS = ("auto", "bf16", "fp32")  # the values of synthq.config.fields.PrecisionName

# (resolved precision, device type) of the running stage
_CURRENT: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("precision", default=None)


# seen on a 2-core AMD EPYC without AVX512-BF16: the first step of a SmolLM2 warm start had not
# finished after 7 minutes, where fp32 took about 27 s a step there
EMULATED_BF16_WARNING = (
    "--precision bf16 on a CPU without bf16 arithmetic (no avx512_bf16 or amx_bf16 in "
    "/proc/cpuinfo): torch emulates it, far slower than fp32, and the expected minutes "
    "printed assume fp32; use --precision fp32 here"
)


class PrecisionError(ValueError):
    """A precision this device cannot run."""


def resolve_precision(requested: str, device: str | torch.device) -> str:
    """``bf16`` or ``fp32`` for ``requested`` on ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``mps``).

    Raises:
        PrecisionError: bf16 on a GPU without bf16 support, or on MPS; an unknown precision.
    """
    import torch

    if requested not in PRECISIONS:
        raise PrecisionError(f"precision must be one of {PRECISIONS}, not {requested!r}")
    kind = torch.device(device).type
    cuda_bf16 = kind == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if requested == "auto":
        return "bf16" if cuda_bf16 else "fp32"
    if requested == "bf16" and kind == "mps":
        raise PrecisionError("--precision bf16 runs on CUDA GPUs and CPUs, not MPS; use --precision fp32")
    if requested == "bf16" and kind == "cuda" and not cuda_bf16:
        raise PrecisionError(
            f"--precision bf16: {torch.cuda.get_device_name(torch.device(device))} has no bf16 support; "
            "use --precision fp32"
        )
    return requested


@contextlib.contextmanager
def use_precision(requested: str, device: str | torch.device) -> Iterator[str]:
    """Run the enclosed stage at ``requested`` precision on ``device``; yields the resolved one."""
    import torch

    resolved = resolve_precision(requested, device)
    kind = torch.device(device).type
    if resolved == "bf16" and kind == "cpu" and _emulates_bf16():
        from synthq.runtime.console import warn

        warn(EMULATED_BF16_WARNING)
    token = _CURRENT.set((resolved, kind))
    try:
        yield resolved
    finally:
        _CURRENT.reset(token)


def would_emulate_bf16(requested: str, device: str) -> bool:
    """Whether a stage at ``requested`` precision on ``device`` (a ``--device`` value) would run
    bf16 on this CPU without bf16 arithmetic, where :func:`use_precision` warns: for
    ``synthq run --dry-run``, before anything starts. Only an explicit ``bf16`` can (``auto`` is
    fp32 on a CPU); torch is asked about an ``auto`` device only then."""
    if requested != "bf16" or not _emulates_bf16():
        return False
    from synthq.runtime.distributed import resolve_device

    return resolve_device(device) == "cpu"


def stage(run: Callable) -> Callable:
    """Decorate a stage's ``run(config)``: the run uses ``config.precision`` on ``config.device``."""

    @functools.wraps(run)
    def wrapper(config, *args, **kwargs):
        from synthq.runtime.distributed import device_for

        with use_precision(config.precision, device_for(config.device)):
            return run(config, *args, **kwargs)

    return wrapper


def current() -> str | None:
    """The running stage's resolved precision (``None`` outside a stage that sets one)."""
    state = _CURRENT.get()
    return state[0] if state else None


@functools.cache
def cpu_flags() -> list[str]:
    """This CPU's instruction-set flags (Linux's ``/proc/cpuinfo``; none elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    rows = (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags"))
    return next(rows, [])


def native_bf16_cpu() -> bool:
    """Whether this CPU has bf16 arithmetic (AVX512-BF16 or AMX-BF16): where it does, CPU autocast
    to bf16 is faster than fp32; elsewhere it converts and is slower."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _emulates_bf16() -> bool:
    """This x86 CPU lacks bf16 arithmetic (:func:`native_bf16_cpu`), and this is the main process
    (torchrun's other ranks would say the same). Other architectures name bf16 elsewhere (ARM's
    ``Features``), so nothing is claimed about them."""
    from synthq.runtime.distributed import topology

    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    return x86 and not native_bf16_cpu() and topology().is_main


def on_native_bf16_cpu() -> bool:
    """The running stage autocasts to bf16 on a CPU with bf16 arithmetic (:func:`native_bf16_cpu`)."""
    return _CURRENT.get() == ("bf16", "cpu") and native_bf16_cpu()


def forward_autocast() -> contextlib.AbstractContextManager:
    """The context for a forward pass: bf16 autocast when the stage runs at bf16, else nothing."""
    state = _CURRENT.get()
    if state is None or state[0] != "bf16":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=state[1], dtype=torch.bfloat16)


def full_precision() -> contextlib.AbstractContextManager:
    """Autocast switched off on the CPU and on CUDA (for the DP arithmetic, whatever context
    encloses it). It reads no stage state: autograd carries autocast's state into its CUDA
    worker threads, where a stage's context variable is not set."""
    import torch

    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast(device_type="cpu", enabled=False))
    if torch.cuda.is_available():
        stack.enter_context(torch.autocast(device_type="cuda", enabled=False))
    return stack


def as_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """A floating tensor in fp32 (fp64 kept); anything else (token ids) unchanged."""
    import torch

    if tensor.is_floating_point() and tensor.dtype not in (torch.float32, torch.float64):
        return tensor.float()
    return tensor


def autocast_forward(function: Callable) -> Callable:
    """Decorate an inference function whose forward passes run at the stage's precision
    (scoring, sampling, encoding); its results should be read in fp32 (``.float()``)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with forward_autocast():
            return function(*args, **kwargs)

    return wrapper
