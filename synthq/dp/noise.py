"""Secret randomness and Gaussian noise: what an adversary must not know, and the noise drawn from it.

:class:`SecretRandomness` holds the run's sampling and noise generators and the key of its keyed
choices. They are drawn from the operating system's secure randomness unless a reproducible
``seed`` is asked for, in which case the guarantee says that an adversary who knows the seed is
not covered. The secret state lives only in private checkpoints (for ``--resume``), never in a
released file.

:func:`add_noise` draws ``N(0, std²)`` on every coordinate of a list of tensors, in parallel
streams whose output depends on the secret generator and the tensors' sizes only. It is called
by :meth:`synthq.dp.engine.PrivacyPlan.privatize` alone: all gradient noise goes through the plan.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from concurrent.futures import ThreadPoolExecutor

import torch

from synthq.runtime import distributed
from synthq.runtime.errors import PrivacyError


class SecretRandomness:
    """The randomness an adversary must not know: Poisson sampling, noise, keyed choices.

    Args:
        seed: ``None`` (default) draws every seed from the OS's secure randomness
            (:mod:`secrets`); an integer makes the run bit-reproducible, and
            :meth:`assumption` then says the guarantee does not hold against anyone who knows it.

    Under torchrun rank 0 draws the secrets and broadcasts them, so every rank samples the same
    global batch and adds the same noise once. :meth:`state_dict` is for private checkpoints only.
    """

    def __init__(self, seed: int | None = None):
        self.seed = seed
        if seed is None:
            drawn = distributed.broadcast(
                (secrets.randbits(63), secrets.randbits(63), secrets.token_bytes(32))
            )
            sampling_seed, noise_seed, self.key = drawn
        else:
            sampling_seed, noise_seed = seed, seed + 1
            self.key = hashlib.sha256(f"synthq-reproducible-seed-{seed}".encode()).digest()
        self.sampling = torch.Generator().manual_seed(sampling_seed)
        self.noise = torch.Generator().manual_seed(noise_seed)

    @property
    def reproducible(self) -> bool:
        return self.seed is not None

    def assumption(self) -> str | None:
        if self.seed is None:
            return None
        return (
            f"reproducible seed {self.seed}: sampling and noise can be replayed by anyone who knows it, "
            "so the guarantee does not hold against such an adversary"
        )

    def keyed_choice(self, modulo: int, *parts: object) -> int:
        """A uniform choice in ``[0, modulo)`` determined by the secret key and ``parts`` alone
        (an HMAC), so it depends on no other example and cannot be predicted without the key."""
        message = "\x1f".join(map(str, parts)).encode()
        digest = hmac.new(self.key, message, hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big") % modulo

    def seed_torch(self, rank: int = 0) -> None:
        """Seed torch's global generator, which dropout draws from, for the training loop: from the
        reproducible seed (``seed + rank``) when one is asked for, else from the secret key (an HMAC
        of the rank), never from torch's process default. Each torchrun rank gets its own masks.
        (DP does not rest on dropout being secret: every per-unit gradient is clipped whatever the
        masks. But the masks are part of the run, and the run's randomness is this object's.)"""
        if self.seed is not None:
            torch.manual_seed(self.seed + rank)
        else:
            torch.manual_seed(self.keyed_choice(2**63, "torch-global-generator", rank))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            "sampling": self.sampling.get_state(),
            "noise": self.noise.get_state(),
            "key": torch.tensor(list(self.key), dtype=torch.uint8),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.sampling.set_state(state["sampling"])
        self.noise.set_state(state["noise"])
        self.key = bytes(state["key"].tolist())


# The noise of one call is drawn by NOISE_STREAMS generators, each seeded from the run's secret
# noise generator and each covering a fixed contiguous span of the call's coordinates (the
# tensors taken in order, flattened), in chunks of NOISE_CHUNK. The streams run on torch's
# threads at once; since the spans depend only on the tensors' sizes, the noise is the same on
# any thread count and any rank. Measured alone on 2 cores for SmolLM2-135M's 135 M coordinates
# (benchmarks/finetune_step.py --noise, make bench 2026-11-25): 0.26 s, against 0.51 s for one
# generator (mt19937 is sequential) drawing a fresh ``torch.normal`` tensor per parameter.
NOISE_STREAMS = 8
NOISE_CHUNK = 1 << 22


def _noise_spans(sizes: list[int], streams: int) -> list[list[tuple[int, int, int]]]:
    """Each stream's pieces ``(tensor index, start, stop)`` in its tensors' flat coordinates."""
    total = sum(sizes)
    bounds = [total * s // streams for s in range(streams + 1)]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    spans = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        pieces = []
        for index, size in enumerate(sizes):
            start, stop = max(lo, offsets[index]), min(hi, offsets[index] + size)
            while start < stop:
                end = min(stop, start + NOISE_CHUNK)
                pieces.append((index, start - offsets[index], end - offsets[index]))
                start = end
        spans.append(pieces)
    return spans


def add_noise(tensors: list[torch.Tensor], std: float, generator: torch.Generator) -> list[torch.Tensor]:
    """``tensor += N(0, std²)`` for every coordinate, **in place** (the tensors are returned).

    :data:`NOISE_STREAMS` generators, seeded by 63-bit draws from ``generator`` (the run's secret
    noise stream), each draw a fixed span of the coordinates, in parallel on torch's threads: the
    noise depends on ``generator`` and the tensors' sizes only (every rank of a torchrun job
    draws the same noise, on the CPU, and moves it to the tensor's device). Extra memory: one
    chunk of :data:`NOISE_CHUNK` coordinates per thread."""
    tensors = list(tensors)
    low = sorted({str(t.dtype) for t in tensors if t.dtype not in (torch.float32, torch.float64)})
    if low:  # noise rounded to a short mantissa is not the Gaussian the accountant assumed
        raise PrivacyError(f"DP noise is added in fp32 or fp64, not to {', '.join(low)} sums")
    if std <= 0 or not tensors:
        return tensors
    seeds = torch.randint(0, 2**63 - 1, (NOISE_STREAMS,), generator=generator).tolist()
    flats = [t.view(-1) if t.is_contiguous() else t.contiguous().view(-1) for t in tensors]
    spans = _noise_spans([f.numel() for f in flats], NOISE_STREAMS)

    def draw(stream: int) -> None:
        stream_generator = torch.Generator().manual_seed(seeds[stream])
        buffer = torch.empty(max((b - a for _, a, b in spans[stream]), default=0))  # ≤ NOISE_CHUNK
        for index, start, stop in spans[stream]:
            noise = buffer[: stop - start].normal_(0.0, std, generator=stream_generator)
            flats[index][start:stop].add_(noise.to(flats[index].device, flats[index].dtype))

    workers = min(torch.get_num_threads(), NOISE_STREAMS)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(draw, range(NOISE_STREAMS)))
    else:
        for stream in range(NOISE_STREAMS):
            draw(stream)
    for tensor, flat in zip(tensors, flats, strict=True):
        if not tensor.is_contiguous():  # the noise went into a contiguous copy
            tensor.copy_(flat.view(tensor.shape))
    return tensors
