"""Where tensors live and where randomness comes from.

klviz never uses the global random state behind your back: every function that samples takes a
``torch.Generator``. The helpers here pick a device and build a seeded generator on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from .validation import ArgumentTypeError


def default_device() -> torch.device:
    """CUDA when a GPU is visible, otherwise the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Turn ``None``/``"auto"`` into :func:`default_device`, and a name into a ``torch.device``."""
    if device is None or device == "auto":
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a device name ({err})") from None
    if dev.type == "meta":
        raise ValueError(
            f"device {device!r}: a 'meta' tensor has a shape but no numbers; klviz computes on 'cpu' or 'cuda'"
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but no CUDA GPU is available here")
    return dev


def make_generator(seed: int = 0, device: str | torch.device | None = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``: same seed, same samples (per device)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ArgumentTypeError(f"seed must be a non-negative integer, got {type(seed).__name__} {seed!r}")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed must lie in [0, 2**64), got {seed!r}")
    gen = torch.Generator(device=resolve_device(device))
    gen.manual_seed(int(seed))
    return gen


def check_generator(generator: torch.Generator | None, device: torch.device) -> None:
    """Raise ``ValueError`` if ``generator`` lives on another device type than ``device``."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if torch.device(generator.device).type != device.type:
        raise ValueError(
            f"generator lives on {generator.device} but the samples are drawn on {device}; "
            "make it with klviz.make_generator(seed, device)"
        )


def panel_sample_count(device: str | torch.device | None, *, cpu: int, cuda: int) -> int:
    """A panel's default number of samples on ``device``: ``cuda`` on a GPU, ``cpu`` elsewhere.

    Panels whose sample count sets only the precision of a Monte Carlo figure (not the noise a
    lesson is about) start larger on a GPU, where the sampling and the reductions cost about a
    millisecond even at 10^6-10^7 samples; ``benchmarks/panels.py --device cuda`` measures them.
    """
    for name, value in (("cpu", cpu), ("cuda", cuda)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    return cuda if dev.type == "cuda" else cpu


def describe_device(device: torch.device | None = None) -> str:
    """A short human description, e.g. ``"cpu (2 threads)"`` or ``"cuda:0 (NVIDIA H200)"``."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{idx} ({torch.cuda.get_device_name(idx)})"
    threads = torch.get_num_threads()
    return f"cpu ({threads} thread{'' if threads == 1 else 's'})"


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run tiny CPU tensor work on one thread, then restore the caller's setting.

    For a 3-token policy, a 45k-parameter model or a chunk that fits in cache, a second thread only
    adds hand-offs: on a busy 2-core machine the default thread pool made the tiny LM's sampling 30x
    slower than one thread.
    """
    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)
