"""klviz: how reinforcement learning for language models estimates KL divergence from sampled tokens.

Direction rule used throughout: tokens x are drawn from the **sampler** q, ``log_r = log p(x) -
log q(x)`` (target minus sampler), and k1, k2, k3 estimate **KL(q || p)**.

``import klviz`` itself is light (no torch, matplotlib or ipywidgets, so that ``klviz --help`` starts
at once): every public name below, and every submodule, loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the submodule that defines it (imported on first access).
_LAZY: dict[str, str] = {
    "default_device": "devices",
    "describe_device": "devices",
    "make_generator": "devices",
    "resolve_device": "devices",
    "categorical_kl": "divergences",
    "exact_kl": "divergences",
    "gaussian_kl": "divergences",
    "AGG_MODES": "estimators",
    "KL_PENALTY_KINDS": "estimators",
    "agg_loss": "estimators",
    "k1": "estimators",
    "k2": "estimators",
    "k3": "estimators",
    "kl_penalty": "estimators",
    "masked_mean": "estimators",
    "expected_kl_gradient": "gradients",
    "forward_kl_gradient": "gradients",
    "gradient_coefficient": "gradients",
    "reverse_kl_gradient": "gradients",
    "sampled_kl_gradients": "gradients",
    "categorical_counts": "montecarlo",
    "estimator_stats": "montecarlo",
    "setup_notebook": "notebook",
    "show_source": "notebook",
    "audit_loss": "audit",
}

if TYPE_CHECKING:  # what a type checker and an editor see; at run time these load lazily
    from . import check
    from .audit import audit_loss
    from .devices import default_device, describe_device, make_generator, resolve_device
    from .divergences import categorical_kl, exact_kl, gaussian_kl
    from .estimators import AGG_MODES, KL_PENALTY_KINDS, agg_loss, k1, k2, k3, kl_penalty, masked_mean
    from .gradients import (
        expected_kl_gradient,
        forward_kl_gradient,
        gradient_coefficient,
        reverse_kl_gradient,
        sampled_kl_gradients,
    )
    from .montecarlo import categorical_counts, estimator_stats
    from .notebook import setup_notebook, show_source

__all__ = [
    "k1",
    "k2",
    "k3",
    "kl_penalty",
    "KL_PENALTY_KINDS",
    "masked_mean",
    "agg_loss",
    "AGG_MODES",
    "exact_kl",
    "gaussian_kl",
    "categorical_kl",
    "estimator_stats",
    "categorical_counts",
    "expected_kl_gradient",
    "reverse_kl_gradient",
    "forward_kl_gradient",
    "sampled_kl_gradients",
    "gradient_coefficient",
    "default_device",
    "resolve_device",
    "make_generator",
    "describe_device",
    "setup_notebook",
    "show_source",
    "check",
    "audit_loss",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Public names and submodules load on first use: ``klviz.k3``, ``klviz.check.lesson02`` and
    ``klviz.widgets.StartHerePanel`` all work after a plain ``import klviz``."""
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    if name.startswith("_"):
        raise AttributeError(name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as err:
        if err.name == f"{__name__}.{name}":
            raise AttributeError(f"module 'klviz' has no attribute {name!r}") from None
        raise


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
