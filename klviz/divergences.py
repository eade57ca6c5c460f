"""Exact KL divergences: closed forms and full sums over a vocabulary.

These are the ground truth that every sampled estimate in klviz is compared against.
"""

from __future__ import annotations

import torch

from .validation import Tensor, as_float_tensor, check_dim, check_finite_values, check_positive_int, common_dtype

__all__ = ["exact_kl", "gaussian_kl", "categorical_kl"]

# Rows per chunk are chosen so that one chunk of logits holds about this many numbers. Each chunk
# needs two scratch buffers of its size (64 MiB each in float32 on the CPU): far below the
# gigabytes that a whole [4096, 50257] batch of log-probabilities takes, and large enough that
# the six parallel kernels per chunk are started only a few dozen times in all (on a busy CPU
# every start of torch's thread pool can wait for a time slice, so many small chunks are slow).
_CHUNK_ELEMENTS = {"cpu": 1 << 24, "cuda": 1 << 26}
_DEFAULT_CHUNK = 1 << 24


def _kl_rows(q: Tensor, p: Tensor, buf_a: Tensor, buf_b: Tensor) -> Tensor:
    """KL(softmax(q) || softmax(p)) for each row of two [rows, V] chunks, using two scratch buffers.

    Six fused kernels: log q, log p (``log_softmax``), log q - log p, q = exp(log q), the product,
    and a row sum (pairwise summation on the CPU, so the float32 sum of 50k terms stays accurate).
    """
    log_q = torch.log_softmax(q, dim=-1, out=buf_a)
    log_p = torch.log_softmax(p, dim=-1, out=buf_b)
    diff = torch.sub(log_q, log_p, out=buf_b)  # log q - log p
    return log_q.exp_().mul_(diff).sum(-1)  # sum_x q(x) [log q(x) - log p(x)]


def _kl_rows_with_zeros(q: Tensor, p: Tensor) -> Tensor:
    """Same as :func:`_kl_rows` but with 0 · log 0 = 0 where q has -inf logits."""
    log_q = torch.log_softmax(q, dim=-1)
    log_p = torch.log_softmax(p, dim=-1)
    w = log_q.exp()
    term = torch.where(w > 0, w * (log_q - log_p), torch.zeros((), dtype=q.dtype, device=q.device))
    return term.sum(-1)


def _logits(x: Tensor, name: str) -> Tensor:
    """Checked logits; half precision stays half here and is widened chunk by chunk."""
    if isinstance(x, Tensor) and x.dtype in (torch.float16, torch.bfloat16):
        if x.numel() == 0:
            raise ValueError(f"{name} is empty (shape {tuple(x.shape)}); there is nothing to estimate from")
        return x
    return as_float_tensor(x, name, check_finite=False)


def exact_kl(q_logits: Tensor, p_logits: Tensor, dim: int = -1, *, chunk_elements: int | None = None) -> Tensor:
    """Exact **KL(softmax(q_logits) || softmax(p_logits))**, summed over the vocabulary axis ``dim``.

    No sampling: ``sum_x q(x) [log q(x) - log p(x)]`` at every position, the quantity that k1, k2
    and k3 estimate from a single sampled token (tokens drawn from q). The rows are processed in
    chunks of about ``chunk_elements`` numbers (default: 16 million on the CPU, 64 million on
    CUDA), with two chunk-sized scratch buffers, so the extra memory is bounded whatever the batch
    size: a [4096, 50257] pair of float32 logits needs 128 MiB beside its result, where
    ``F.kl_div`` on two ``log_softmax`` outputs needs three full-size 0.8 GiB temporaries.

    ``-inf`` logits mean probability zero and are allowed (0 · log 0 counts as 0); if p gives zero
    probability to a token that q can emit, the KL is ``+inf`` (that is its value). NaN or ``+inf``
    logits raise ``ValueError``. Half-precision logits are computed in float32 chunk by chunk.
    Returns the input shape without ``dim``.
    """
    q = _logits(q_logits, "q_logits")
    p = _logits(p_logits, "p_logits")
    if q.shape != p.shape:
        raise ValueError(f"q_logits has shape {tuple(q.shape)} but p_logits has shape {tuple(p.shape)}")
    if q.dim() == 0:
        raise ValueError("q_logits must have a vocabulary axis; got a scalar")
    if q.device != p.device:
        raise ValueError(f"q_logits is on {q.device} but p_logits is on {p.device}")
    dim = check_dim(dim, q.dim())
    if chunk_elements is None:
        chunk_elements = _CHUNK_ELEMENTS.get(q.device.type, _DEFAULT_CHUNK)
    chunk_elements = check_positive_int(chunk_elements, "chunk_elements")
    out_dtype = common_dtype(q, p)
    qm, pm = q.movedim(dim, -1), p.movedim(dim, -1)
    batch_shape, vocab = qm.shape[:-1], qm.shape[-1]
    if vocab == 0:
        raise ValueError("q_logits has an empty vocabulary axis")
    qm, pm = qm.reshape(-1, vocab), pm.reshape(-1, vocab)  # a view when the layout allows it
    if torch.is_grad_enabled() and (qm.requires_grad or pm.requires_grad):
        # Logits that carry a gradient (a model's outputs): the differentiable path, one autograd
        # graph per chunk of rows (the buffered kernels below write into scratch with out=, which
        # autograd cannot follow). Same values; memory then grows with the graph, as for any loss.
        return _exact_kl_autograd(qm, pm, out_dtype, chunk_elements).reshape(batch_shape)
    rows = qm.shape[0]
    out = torch.empty(rows, dtype=out_dtype, device=q.device)
    step = min(rows, max(1, chunk_elements // vocab))
    buf_a = torch.empty(step, vocab, dtype=out_dtype, device=q.device)
    buf_b = torch.empty_like(buf_a)
    for start in range(0, rows, step):
        qc = qm[start : start + step].to(out_dtype)
        pc = pm[start : start + step].to(out_dtype)
        m = qc.shape[0]
        kl = _kl_rows(qc, pc, buf_a[:m], buf_b[:m])
        if not torch.isfinite(kl).all():
            # rare path: find out whether the input is bad or merely has zero-probability tokens
            check_finite_values(qc, "q_logits", allow_neg_inf=True)
            check_finite_values(pc, "p_logits", allow_neg_inf=True)
            if bool(torch.isneginf(qc).all(-1).any()):
                raise ValueError("q_logits has a position where every logit is -inf (no distribution)")
            if bool(torch.isneginf(pc).all(-1).any()):
                raise ValueError("p_logits has a position where every logit is -inf (no distribution)")
            kl = _kl_rows_with_zeros(qc, pc)
        out[start : start + m] = kl.clamp_min_(0.0)  # KL >= 0; removes rounding below zero
    return out.reshape(batch_shape)


def _exact_kl_autograd(qm: Tensor, pm: Tensor, dtype: torch.dtype, chunk_elements: int) -> Tensor:
    """Row KLs of [rows, V] logits with autograd (see :func:`exact_kl`)."""
    check_finite_values(qm.detach(), "q_logits", allow_neg_inf=True)
    check_finite_values(pm.detach(), "p_logits", allow_neg_inf=True)
    step = max(1, chunk_elements // qm.shape[-1])
    parts = [
        _kl_rows_with_zeros(qm[i : i + step].to(dtype), pm[i : i + step].to(dtype)).clamp_min(0.0)
        for i in range(0, qm.shape[0], step)
    ]
    return torch.cat(parts)


def gaussian_kl(mu_q: Tensor | float, sigma_q: Tensor | float, mu_p: Tensor | float, sigma_p: Tensor | float) -> Tensor:
    """Closed-form **KL(N(mu_q, sigma_q²) || N(mu_p, sigma_p²))** (broadcasts; sigmas are std devs).

    ``log(sigma_p / sigma_q) + (sigma_q² + (mu_q - mu_p)²) / (2 sigma_p²) - ½``.
    """
    mq = as_float_tensor(mu_q, "mu_q")
    sq = as_float_tensor(sigma_q, "sigma_q")
    mp = as_float_tensor(mu_p, "mu_p")
    sp = as_float_tensor(sigma_p, "sigma_p")
    for t, name in ((sq, "sigma_q"), (sp, "sigma_p")):
        if bool((t <= 0).any()):
            raise ValueError(f"{name} must be a positive standard deviation, got {t.min().item():g}")
    try:
        mq, sq, mp, sp = torch.broadcast_tensors(mq, sq, mp, sp)
    except RuntimeError as err:
        raise ValueError(f"mu_q, sigma_q, mu_p, sigma_p do not broadcast together: {err}") from None
    dtype = common_dtype(mq, sq, mp, sp)
    mq, sq, mp, sp = (t.to(dtype) for t in (mq, sq, mp, sp))
    return torch.log(sp / sq) + (sq.square() + (mq - mp).square()) / (2 * sp.square()) - 0.5


def categorical_kl(q_probs: Tensor, p_probs: Tensor, dim: int = -1) -> Tensor:
    """Exact **KL(q || p)** for probability vectors along ``dim`` (0 · log 0 = 0; q>0, p=0 gives inf).

    The probabilities must be non-negative and sum to 1 (within 1e-4) along ``dim``.
    """
    q = as_float_tensor(q_probs, "q_probs")
    p = as_float_tensor(p_probs, "p_probs")
    if q.shape != p.shape:
        raise ValueError(f"q_probs has shape {tuple(q.shape)} but p_probs has shape {tuple(p.shape)}")
    if q.dim() == 0:
        raise ValueError("q_probs must have a category axis; got a scalar")
    dim = check_dim(dim, q.dim())
    for t, name in ((q, "q_probs"), (p, "p_probs")):
        if bool((t < 0).any()):
            raise ValueError(f"{name} has negative probabilities")
        total = t.sum(dim)
        if not torch.allclose(total, torch.ones_like(total), atol=1e-4):
            raise ValueError(
                f"{name} does not sum to 1 along dim={dim} (sums range "
                f"{total.min().item():.6g} to {total.max().item():.6g})"
            )
    dtype = common_dtype(q, p)
    q, p = q.to(dtype), p.to(dtype)
    term = torch.where(q > 0, q * (torch.log(q) - torch.log(p)), torch.zeros((), dtype=dtype, device=q.device))
    return term.sum(dim)
