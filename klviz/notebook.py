"""What the first cell of every lesson calls: figures, style, device, and a line about the machine."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# torch, matplotlib (through .plotting) and the device helpers are imported inside the functions that
# use them: ``klviz.show_source`` and ``import klviz`` stay light.

__all__ = ["setup_notebook", "use_one_thread_on_small_machines"]


def use_one_thread_on_small_machines() -> None:
    """On a machine with two cores or fewer, run torch's CPU kernels on one thread.

    The lessons' tensors are small and a kernel shares those cores with JupyterLab and the browser:
    measured here, two OpenMP threads made chunked Monte Carlo runs up to ten times slower whenever
    another process was busy, and one thread was never much slower. Larger machines keep torch's default.
    """
    import torch

    if (os.cpu_count() or 1) <= 2 and torch.get_num_threads() > 1:
        torch.set_num_threads(1)


def setup_notebook(interactive: bool | None = None, quiet: bool = False) -> torch.device:
    """Choose the figure backend, apply the klviz style and return the device lessons compute on.

    Interactive figures (ipympl, ``%matplotlib widget``) are used in a live kernel; set the
    environment variable ``KLVIZ_STATIC=1`` (the static site does) or pass ``interactive=False``
    for inline PNG figures. Outside IPython this only applies the style. In presenter mode
    (``KLVIZ_PRESENTER=1``, set by ``klviz present``) the line about the machine is not printed.
    """
    import torch

    from .devices import default_device, describe_device
    from .memory import release_freed_memory
    from .plotting import apply_style

    if interactive is None:
        interactive = os.environ.get("KLVIZ_STATIC", "") not in ("1", "true", "yes")
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except ImportError:  # pragma: no cover - IPython is a dependency
        ip = None
    if ip is not None:
        ip.run_line_magic("matplotlib", "widget" if interactive else "inline")
        if release_freed_memory not in ip.events.callbacks["post_run_cell"]:
            ip.events.register("post_run_cell", release_freed_memory)
    apply_style()
    use_one_thread_on_small_machines()
    device = default_device()
    if not (quiet or os.environ.get("KLVIZ_PRESENTER") == "1"):
        print(f"klviz on {describe_device(device)} · torch {torch.__version__} · Python {platform.python_version()}")
    return device


def show_source(obj: Callable[..., Any] | ModuleType) -> None:
    """Display the source code of a klviz function or class, highlighted, so a lesson can show the
    library's one copy of the code instead of pasting a second one."""
    import inspect

    from IPython.display import Code, display

    display(Code(inspect.getsource(obj), language="python"))
