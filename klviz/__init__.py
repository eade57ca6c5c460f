"""klviz: how reinforcement learning for language models estimates KL divergence from sampled tokens.

Direction rule used throughout: tokens x are drawn from the **sampler** q, ``log_r = log p(x) -
log q(x)`` (target minus sampler), and k1, k2, k3 estimate **KL(q || p)**.
"""
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
from . import check
from .notebook import setup_notebook, show_source

__version__ = "0.1.0"

__all__ = [
    "k1", "k2", "k3", "kl_penalty", "KL_PENALTY_KINDS", "masked_mean", "agg_loss", "AGG_MODES",
    "exact_kl", "gaussian_kl", "categorical_kl", "estimator_stats", "categorical_counts",
    "expected_kl_gradient", "reverse_kl_gradient", "forward_kl_gradient", "sampled_kl_gradients",
    "gradient_coefficient", "default_device", "resolve_device", "make_generator", "describe_device",
    "setup_notebook", "show_source", "check", "__version__",
]


def __getattr__(name: str):
    """Submodules that pull in heavier dependencies (widgets, the tiny LM, ...) load on first use:
    ``klviz.widgets.StartHerePanel`` works after a plain ``import klviz``."""
    import importlib

    if name.startswith("_"):
        raise AttributeError(name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as err:
        if err.name == f"{__name__}.{name}":
            raise AttributeError(f"module 'klviz' has no attribute {name!r}") from None
        raise
