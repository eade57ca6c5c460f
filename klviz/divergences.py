"""Exact KL divergences: closed forms and full sums over a vocabulary.

These are the ground truth that every sampled estimate in klviz is compared against.
"""

from __future__ import annotations

import torch

from . import kernel
from .validation import Tensor, as_float_tensor, check_dim, check_finite_values, check_positive_int, common_dtype

__all__ = [
    "exact_kl",
    "EXACT_KL_RELATIVE_ERROR",
    "EXACT_KL_SQRT_ERROR",
    "exact_kl_error_bound",
    "gaussian_kl",
    "categorical_kl",
    "log_ratio_tolerance",
    "target_favours",
]

# Rows per chunk are chosen so that one chunk holds about this many numbers. Each chunk needs three
# scratch buffers of its size (64 MiB each in float32 on the CPU; float64 chunks are half as long):
# far below the gigabytes that a whole [4096, 50257] batch of log-probabilities takes, and large
# enough that the kernels per chunk are started only a few dozen times in all (on a busy CPU every
# start of torch's thread pool can wait for a time slice: chunks of 2^22 numbers took 1.5 times as
# long as chunks of 2^24, measured at a load of 6 on 2 cores).
_CHUNK_ELEMENTS = {"cpu": 1 << 24, "cuda": 1 << 26}
_DEFAULT_CHUNK = 1 << 24

#: What :func:`exact_kl`'s float64 arithmetic can be trusted to (float64 logits, and float32 rows that need it):
#: an error of at most ``EXACT_KL_RELATIVE_ERROR · KL + EXACT_KL_SQRT_ERROR · sqrt(KL)`` (the second term,
#: rounding of logit differences of size sqrt(KL), matters only below a KL of about 1e-6). The claim
#: ``exact-kl-accurate`` of lesson 01 checks it against 80-bit arithmetic on random token pairs.
EXACT_KL_RELATIVE_ERROR = 1e-12
EXACT_KL_SQRT_ERROR = 1e-15


def exact_kl_error_bound(kl: float, dtype: torch.dtype = torch.float64) -> float:
    """The largest error :func:`exact_kl` may make on a KL of ``kl`` from logits of ``dtype``: the float64
    bound above for float64; for float32 and half, :data:`FLOAT32_RELATIVE_ERROR` relative (its float32
    path) or the float64 bound plus one rounding to float32, whichever is larger."""
    wide = (EXACT_KL_RELATIVE_ERROR) * kl + EXACT_KL_SQRT_ERROR * kl**0.5
    if dtype == torch.float64:
        return wide
    return max(FLOAT32_RELATIVE_ERROR * kl, wide + torch.finfo(torch.float32).eps / 2 * kl)


def _kl_rows(q: Tensor, p: Tensor, buf_a: Tensor, buf_b: Tensor, buf_c: Tensor) -> Tensor:
    """KL(softmax(q) || softmax(p)) for each row of two [rows, V] chunks, in three float64 scratch buffers.

    With the logit differences d = p - q and s = d - E_q[d] (centred under q),

        KL(q || p) = log E_q[e^s] = log(1 + E_q[k3(s)]),   k3(s) = e^s - 1 - s >= 0,

    because log p - log q = d - log E_q[e^d]. Every term q(x) k3(s_x) is non-negative, so the sum has
    no cancellation and the result is never negative; and the error of each s_x scales with the
    logit *differences*, not with the logits or with log V, so a tiny KL between two nearby policies
    keeps its digits (the textbook sum of q (log q - log p) subtracts two log-softmaxes whose
    rounding, about eps · |log q|, is then larger than the log-ratio itself). The two weighted sums
    over the vocabulary are batched dot products (one pass each, no product written out).
    """
    q64 = buf_a.copy_(q)  # exact: every float32 or half value is a float64 value
    d = buf_b.copy_(p).sub_(q64)  # p - q
    w = torch.log_softmax(q64, dim=-1, out=buf_c).exp_()  # q(x)
    s = d.sub_(torch.bmm(d.unsqueeze(1), w.unsqueeze(2)).squeeze(-1))  # d - E_q[d]
    k3 = torch.expm1(s, out=buf_a).sub_(s)  # e^s - 1 - s: 0 up to rounding where s is tiny
    # (rounding can leave a term an ulp below 0; the clamp on the sum keeps the KL >= 0)
    return torch.bmm(k3.unsqueeze(1), w.unsqueeze(2)).reshape(-1).clamp_min_(0.0).log1p_()


#: The relative error :func:`exact_kl` allows its float32 arithmetic on float32 and half logits; rows
#: whose estimated error is larger are computed again in float64.
FLOAT32_RELATIVE_ERROR = 1e-4


def _kl_rows_float32(q: Tensor, p: Tensor, buf_a: Tensor, buf_b: Tensor, buf_c: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_kl_rows` in float32 (four times less memory traffic), and which rows it cannot vouch for.

    The same formula, log(1 + E_q[k3(s)]); the float32 rounding of s_x is at most eps · |d_x|, and
    ``expm1(s) - s`` rounds with an error of about eps · |s|: relative to the KL, together at most about
    eps · (max|d| + 1) · E_q|e^s - 1| / E_q[k3(s)], with E_q|e^s - 1| <= sqrt(2 E_q[k3(s)]) for small s
    and about E_q[k3(s)] for large s. Rows where four times that estimate (plus the rounding of q and
    of the sums) exceeds
    :data:`FLOAT32_RELATIVE_ERROR`, or that are not finite, are returned as ``suspect``: a tiny KL
    between nearly equal policies, or logits with a large common offset, go to float64.
    """
    w = torch.log_softmax(q, dim=-1, out=buf_a).exp_()  # q(x)
    d = torch.sub(p, q, out=buf_b)  # p - q
    reach = torch.maximum(torch.amax(d, -1), -torch.amin(d, -1)).double()  # max |d| per row
    s = d.sub_(torch.bmm(d.unsqueeze(1), w.unsqueeze(2)).reshape(-1, 1))  # d - E_q[d] (E_q[d] need not be exact)
    k3 = torch.expm1(s, out=buf_c).sub_(s)
    total = k3.mul_(w).sum(-1).double()  # a cascade sum of non-negative terms
    eps = torch.finfo(torch.float32).eps
    spread = torch.clamp((2 / total.clamp_min(1e-300)).sqrt(), min=1.0)
    bound = eps * (16 + 4 * (reach + 1) * spread)  # (reach + 1): s_x's own rounding, and expm1(s) - s's
    suspect = ~(bound <= FLOAT32_RELATIVE_ERROR) | ~torch.isfinite(total)
    return total.clamp_min_(0.0).log1p_(), suspect


def _kl_rows_with_zeros(q: Tensor, p: Tensor) -> Tensor:
    """:func:`_kl_rows` for float64 rows that may hold ``-inf`` logits (probability 0), with autograd.

    Tokens q never emits count 0 · log 0 = 0; p's mass on them still enters p's normalisation (the
    term m below); a token q can emit but p cannot gives ``+inf``.
    """
    zero_q = torch.isneginf(q)
    zero_p = torch.isneginf(p)
    lse_q = torch.logsumexp(q, dim=-1, keepdim=True)
    w = torch.where(zero_q, torch.zeros_like(q), torch.exp(torch.where(zero_q, lse_q, q) - lse_q))
    both = zero_q | zero_p
    d = torch.where(both, torch.zeros_like(q), torch.where(both, torch.zeros_like(p), p) - torch.where(both, lse_q, q))
    d_bar = (w * d).sum(-1, keepdim=True)
    s = torch.where(zero_q, torch.zeros_like(d), d - d_bar)
    k3 = (torch.expm1(s) - s).clamp_min(0.0)
    kl = torch.log1p((w * k3).sum(-1))
    # p's mass where q is 0 (m = sum of e^(p - lse_q) there), in log space: log(e^kl + m e^(-d_bar))
    outside = zero_q & ~zero_p
    if bool(outside.any()):
        log_m = torch.logsumexp(torch.where(outside, p - lse_q, torch.full_like(p, -torch.inf)), dim=-1)
        extra = log_m - d_bar.squeeze(-1)
        kl = torch.where(outside.any(-1), torch.logaddexp(kl, extra), kl)
    blocked = (zero_p & ~zero_q).any(-1)  # q can emit a token that p cannot: KL is +inf
    return torch.where(blocked, torch.full_like(kl, torch.inf), kl)


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
    and k3 estimate from a single sampled token (tokens drawn from q).

    **Precision.** The KL is computed as ``log(1 + sum_x q(x) k3(s_x))`` with ``s = (p - q) - E_q[p - q]``
    (the logit differences, centred under q): a sum of non-negative terms, so the result is never
    negative and nothing cancels, and the rounding of each term scales with the logit *differences*, so
    a KL of 1e-9 between two nearby policies keeps its digits. Float64 logits are computed in float64:
    within ``1e-12 · KL + 1e-15 · sqrt(KL)`` of the true value (:func:`exact_kl_error_bound`). Float32
    and half logits are computed in float32 where an error estimate vouches for a relative error below
    :data:`FLOAT32_RELATIVE_ERROR` (1e-4; the realised errors are far smaller), and row by row in
    float64 where it does not (a tiny KL between nearly equal policies, logits with a large common
    offset). Both bounds are checked against 80-bit arithmetic on random token pairs of 2 to 50,257
    tokens with logit changes down to 1e-8. The logits themselves are taken as exact: a float32
    model's own rounding is not undone.

    **Memory.** The rows are processed in chunks of about ``chunk_elements`` numbers (default: 16
    million on the CPU, 64 million on CUDA; half as many in float64) with three chunk-sized scratch
    buffers, so the extra memory is bounded whatever the batch size: a [4096, 50257] pair of float32
    logits needs 192 MiB beside its result, where ``F.kl_div`` on two ``log_softmax`` outputs needs
    three full-size 0.8 GiB temporaries.

    ``-inf`` logits mean probability zero and are allowed (0 · log 0 counts as 0); if p gives zero
    probability to a token that q can emit, the KL is ``+inf`` (that is its value). NaN or ``+inf``
    logits raise ``ValueError``. Logits that carry a gradient get the same values with autograd.
    Returns the input shape without ``dim``, in float64 if either input is float64, else float32.
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
    wide = out_dtype == torch.float64
    step = min(rows, max(1, chunk_elements // (2 * vocab if wide else vocab)))
    buffers = [torch.empty(step, vocab, dtype=out_dtype, device=q.device) for _ in range(3)]
    for start in range(0, rows, step):
        qc, pc = qm[start : start + step], pm[start : start + step]
        m = qc.shape[0]
        if wide:
            kl = _kl_rows(qc, pc, *(b[:m] for b in buffers))
            redo = ~torch.isfinite(kl)
        else:  # float32 (half widened): float32 arithmetic, rows it cannot vouch for again in float64
            kl, redo = _kl_rows_float32(qc.float(), pc.float(), *(b[:m] for b in buffers))
        if bool(redo.any()):
            rows_again = redo.nonzero().reshape(-1)
            q64, p64 = qc[rows_again].double(), pc[rows_again].double()
            again = _kl_rows(q64, p64, *(torch.empty_like(q64) for _ in range(3)))
            if not bool(torch.isfinite(again).all()):
                # rare path: find out whether the input is bad or merely has zero-probability tokens
                check_finite_values(q64, "q_logits", allow_neg_inf=True)
                check_finite_values(p64, "p_logits", allow_neg_inf=True)
                if bool(torch.isneginf(q64).all(-1).any()):
                    raise ValueError("q_logits has a position where every logit is -inf (no distribution)")
                if bool(torch.isneginf(p64).all(-1).any()):
                    raise ValueError("p_logits has a position where every logit is -inf (no distribution)")
                again = _kl_rows_with_zeros(q64, p64)
            kl = kl.double().index_put((rows_again,), again)
        out[start : start + m] = kl
    return out.reshape(batch_shape)


def _exact_kl_autograd(qm: Tensor, pm: Tensor, dtype: torch.dtype, chunk_elements: int) -> Tensor:
    """Row KLs of [rows, V] logits with autograd (see :func:`exact_kl`)."""
    check_finite_values(qm.detach(), "q_logits", allow_neg_inf=True)
    check_finite_values(pm.detach(), "p_logits", allow_neg_inf=True)
    if bool(torch.isneginf(qm.detach()).all(-1).any()):
        raise ValueError("q_logits has a position where every logit is -inf (no distribution)")
    if bool(torch.isneginf(pm.detach()).all(-1).any()):
        raise ValueError("p_logits has a position where every logit is -inf (no distribution)")
    step = max(1, chunk_elements // qm.shape[-1])
    parts = [
        _kl_rows_with_zeros(qm[i : i + step].to(torch.float64), pm[i : i + step].to(torch.float64)).to(dtype)
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


def log_ratio_tolerance(log_q: Tensor, log_p: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Per token, the size below which ``log p - log q`` is rounding and not a difference between p and q.

    Log-probabilities held in ``dtype`` (default: the inputs' common dtype, float32 for half) carry a
    rounding error of a few units in the last place of their size, so two log-probabilities of one
    distribution computed two ways (``log_softmax`` of logits divided by a temperature of 1, say) differ
    by about ``eps · |log q|``. The tolerance is ``8 · eps(dtype) · (1 + |log p| + |log q|)``: a
    log-ratio within it is 0 for every purpose of a lesson (its sign is noise, not a preference of p).
    """
    lq, lp = torch.as_tensor(log_q), torch.as_tensor(log_p)
    dt = dtype if dtype is not None else common_dtype(lq, lp)
    eps = torch.finfo(dt).eps
    return 8 * eps * (1 + lq.double().abs() + lp.double().abs())


def target_favours(q_probs: Tensor, p_probs: Tensor) -> Tensor:
    """Boolean mask of the tokens where p(x) > q(x) beyond rounding (:func:`log_ratio_tolerance` in the
    inputs' dtype): where k1 = -log r is negative. ``P_q(k1 < 0)`` is ``q[target_favours(q, p)].sum()``."""
    q = as_float_tensor(q_probs, "q_probs")
    p = as_float_tensor(p_probs, "p_probs")
    if q.shape != p.shape:
        raise ValueError(f"q_probs has shape {tuple(q.shape)} but p_probs has shape {tuple(p.shape)}")
    dtype = common_dtype(q, p)
    lq, lp = q.double().log(), p.double().log()
    return (lp - lq) > log_ratio_tolerance(lq, lp, dtype)


def categorical_kl(q_probs: Tensor, p_probs: Tensor, dim: int = -1) -> Tensor:
    """Exact **KL(q || p)** for probability vectors along ``dim`` (0 · log 0 = 0; q>0, p=0 gives inf).

    The probabilities must be non-negative and sum to 1 (within 1e-4) along ``dim``. Computed in float64
    as ``sum_x q k3(log r) + (sum_x q - sum_{q>0} p)`` (equal to ``sum_x q log(q/p)``): non-negative terms,
    so no cancellation, and never below 0. Where every log-ratio on q's support is within rounding of 0
    (:func:`log_ratio_tolerance` in the inputs' dtype) p and q are the same distribution and the KL is 0.
    Returned in the inputs' common dtype.
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
    q64, p64 = q.double(), p.double()
    support = q64 > 0
    zero = torch.zeros((), dtype=torch.float64, device=q.device)
    lq = torch.log(torch.where(support, q64, torch.ones_like(q64)))
    lp = torch.log(torch.where(support, p64, torch.ones_like(p64)))
    u = torch.where(support, lp - lq, zero)
    same = (u.abs() <= log_ratio_tolerance(lq, lp, dtype)).all(dim)
    terms = torch.where(support, q64 * kernel.k3(u), zero)  # q k3(u) >= 0 (inf where p = 0 < q)
    rest = q64.sum(dim) - torch.where(support, p64, zero).sum(dim)  # 1 - p(S): p's mass where q is 0
    kl = (terms.sum(dim) + rest).clamp_min(0.0)
    return torch.where(same, torch.zeros_like(kl), kl).to(dtype)
