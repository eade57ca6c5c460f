"""Diagnose the KL estimates of your own training run from a dump of its per-token log-probabilities.

A *rollout dump* is a file holding, for one batch of responses, ``[batch, tokens]`` tensors:

- ``logprob``: the policy's log-probability of each response token (verl ``old_log_probs``,
  TRL ``old_per_token_logps`` or the per-token log-probs of the current policy);
- ``ref_logprob``: the reference model's log-probability of the same tokens;
- ``response_mask``: 1 for response tokens that count, 0 for prompt, padding and tokens after EOS;
- ``old_logprob`` (optional): the log-probs of the policy that *sampled* the tokens when it is not
  the one in ``logprob`` (the rollout engine, or pi_old on a second PPO epoch).

Files are read safely: ``.pt``/``.pth`` only with ``torch.load(..., weights_only=True)`` (a pickle
that asks to run code is refused before anything runs), ``.npz`` with ``allow_pickle=False`` and
``.safetensors`` when the ``safetensors`` package is installed. See ``docs/rollout_format.md``.

:func:`load_rollouts` reads and validates a file, :func:`diagnose` analyses it, :func:`format_report`
writes the plain-text report, :func:`plot_report` the optional PNG. ``klviz diagnose FILE`` runs all
of it from the command line.
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

__all__ = [
    "RolloutFileError", "Rollouts", "Diagnosis", "DEFAULT_KEYS", "CLAMPS", "load_rollouts", "rollouts_from_tensors",
    "save_rollouts", "diagnose", "format_report", "plot_report", "sample_rollouts_path", "cluster_mean_se",
]

#: The key each role is read from unless renamed (``--logprob-key`` ... on the command line).
DEFAULT_KEYS: dict[str, str] = {
    "logprob": "logprob", "ref_logprob": "ref_logprob", "response_mask": "response_mask", "old_logprob": "old_logprob",
}
_SUFFIXES = (".pt", ".pth", ".npz", ".safetensors")
#: A per-token |log r| above this is called "very large" in the report (a ratio beyond e^10 ≈ 22026).
LARGE_LOG_RATIO = 10.0


class RolloutFileError(ValueError):
    """A rollout dump that cannot be used; the message is one line that says why."""


@dataclass
class Rollouts:
    """Validated log-probabilities of one batch, as float64 ``[batch, tokens]`` tensors."""

    logprob: torch.Tensor
    ref_logprob: torch.Tensor
    mask: torch.Tensor                      # bool [batch, tokens]
    old_logprob: torch.Tensor | None = None
    source: str = "tensors"
    keys: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_KEYS))
    dtypes: dict[str, str] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.logprob.shape)  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------

def sample_rollouts_path() -> Path:
    """Path of the sample dump shipped with klviz (made with the tiny language model)."""
    return Path(__file__).resolve().parent / "data" / "sample_rollouts.npz"


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _flatten(obj: Any, prefix: str = "", out: dict[str, Any] | None = None, depth: int = 0) -> dict[str, Any]:
    """Flatten nested mappings into ``a.b`` keys (a verl-style ``{"batch": {...}}`` dict works)."""
    out = {} if out is None else out
    if depth > 4:
        return out
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            _flatten(v, name + ".", out, depth + 1)
        else:
            out[name] = v
    return out


def _magic(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(8)


def _read_pt(path: Path) -> dict[str, Any]:
    head = _magic(path)
    if not (head.startswith(b"PK") or head[:1] == b"\x80"):
        raise RolloutFileError("refused: not a torch.save file (neither a zip archive nor a binary pickle); "
                               "nothing in it was executed")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - every failure becomes one line
        msg = str(err)
        found = re.search(r"GLOBAL\s+([\w.]+)", msg)
        if "weights_only" in msg or "WeightsUnpickler" in msg or found:
            what = f" (it asks for {found.group(1)})" if found else ""
            raise RolloutFileError(
                f"refused: the file's pickle wants more than tensors{what}; klviz loads .pt only with "
                "torch.load(weights_only=True), so nothing in it was executed. Save a plain dict of tensors") from None
        raise RolloutFileError(f"not a readable PyTorch file ({type(err).__name__}: {_one_line(msg, 120)})") from None
    if not isinstance(obj, Mapping):
        raise RolloutFileError(f"the file holds a {type(obj).__name__}, expected a dict of tensors keyed by name")
    return _flatten(obj)


def _read_npz(path: Path) -> dict[str, Any]:
    head = _magic(path)
    if head[:1] == b"\x80":
        raise RolloutFileError("refused: the file is a Python pickle, not an .npz archive; klviz reads .npz with "
                               "allow_pickle=False, so nothing in it was executed")
    if not head.startswith(b"PK"):
        raise RolloutFileError("not an .npz archive (no zip signature), so it was not opened; save with numpy.savez or "
                               "klviz.diagnose.save_rollouts")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: np.array(data[name]) for name in data.files}
    except ValueError as err:
        if "pickle" in str(err).lower():
            raise RolloutFileError("refused: an array in the archive holds pickled Python objects; klviz reads .npz "
                                   "with allow_pickle=False, so nothing in it was executed. Save numeric arrays only") from None
        raise RolloutFileError(f"not a readable .npz archive ({_one_line(str(err), 120)})") from None
    except Exception as err:  # noqa: BLE001
        raise RolloutFileError(f"not a readable .npz archive ({type(err).__name__}: {_one_line(str(err), 120)})") from None


def _read_safetensors(path: Path) -> dict[str, Any]:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise RolloutFileError("reading .safetensors needs the 'safetensors' package (pip install safetensors); "
                               "or save the dump as .npz or .pt") from None
    try:
        return dict(load_file(str(path), device="cpu"))
    except Exception as err:  # noqa: BLE001
        raise RolloutFileError(f"not a readable .safetensors file ({type(err).__name__}: {_one_line(str(err), 120)})") from None


def _to_tensor(value: Any, key: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise RolloutFileError(f"key '{key}' has dtype {value.dtype}; expected numbers")
        return torch.from_numpy(np.ascontiguousarray(value))
    raise RolloutFileError(f"key '{key}' holds a {type(value).__name__}, expected a tensor or array")


def load_rollouts(path: str | Path, *, logprob_key: str = "logprob", ref_key: str = "ref_logprob",
                  mask_key: str = "response_mask", old_key: str | None = "old_logprob",
                  require_old: bool = False) -> Rollouts:
    """Read and validate a rollout dump; raise :class:`RolloutFileError` (a ``ValueError``) with one line.

    ``old_key`` is optional: when the file has no such key the tokens are taken to be sampled by the
    policy in ``logprob`` (on-policy), unless ``require_old`` is true (the user named the key).
    """
    p = Path(path)
    if not p.exists():
        raise RolloutFileError(f"no such file: {p}")
    if p.is_dir():
        raise RolloutFileError(f"{p} is a directory, expected a rollout dump file")
    suffix = p.suffix.lower()
    if suffix not in _SUFFIXES:
        raise RolloutFileError(f"not a recognised rollout dump: '{p.name}' should end in "
                               f"{', '.join(_SUFFIXES)} (other files are not opened, pickles never)")
    try:
        if p.stat().st_size == 0:
            raise RolloutFileError(f"{p.name} is empty")
        if suffix in (".pt", ".pth"):
            raw = _read_pt(p)
        elif suffix == ".npz":
            raw = _read_npz(p)
        else:
            raw = _read_safetensors(p)
    except OSError as err:
        raise RolloutFileError(f"cannot read {p.name}: {err.strerror or err}") from None

    keys = {"logprob": logprob_key, "ref_logprob": ref_key, "response_mask": mask_key}
    for role, key in keys.items():
        if key not in raw:
            available = ", ".join(sorted(raw)[:12]) or "none"
            raise RolloutFileError(f"missing key {_label(key, role)}; the file has: {available}. "
                                   f"Rename with --{_option(role)}")
    if old_key is not None and old_key in raw:
        keys["old_logprob"] = old_key
    elif require_old:
        raise RolloutFileError(f"missing key {_label(old_key, 'old_logprob')}; the file has: {', '.join(sorted(raw)[:12])}")
    tensors = {role: _to_tensor(raw[key], key) for role, key in keys.items()}
    return _validate(tensors["logprob"], tensors["ref_logprob"], tensors["response_mask"],
                     tensors.get("old_logprob"), source=str(p), keys=keys)


def _label(key: str, role: str) -> str:
    return f"'{key}'" if key == role else f"'{key}' ({role})"


def _option(role: str) -> str:
    return {"logprob": "logprob-key", "ref_logprob": "ref-key", "response_mask": "mask-key",
            "old_logprob": "old-key"}[role]


def rollouts_from_tensors(logprob: Any, ref_logprob: Any, response_mask: Any, old_logprob: Any = None) -> Rollouts:
    """Validate in-memory tensors (or arrays) the same way a file is validated."""
    ts = {}
    for name, v in (("logprob", logprob), ("ref_logprob", ref_logprob), ("response_mask", response_mask),
                    ("old_logprob", old_logprob)):
        if v is None:
            continue
        ts[name] = _to_tensor(v if isinstance(v, (torch.Tensor, np.ndarray)) else np.asarray(v), name)
    return _validate(ts["logprob"], ts["ref_logprob"], ts["response_mask"], ts.get("old_logprob"),
                     source="tensors", keys={k: k for k in ts})


def _validate(lp: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, old: torch.Tensor | None, *,
              source: str, keys: dict[str, str]) -> Rollouts:
    named = [("logprob", lp), ("ref_logprob", ref)] + ([("old_logprob", old)] if old is not None else [])
    for role, t in named:
        if not t.is_floating_point():
            raise RolloutFileError(f"{_label(keys[role], role)} has dtype {str(t.dtype).replace('torch.', '')}; "
                                   "log-probabilities must be floating point (token ids by mistake?)")
    if mask.is_complex():
        raise RolloutFileError(f"{_label(keys['response_mask'], 'response_mask')} has dtype {mask.dtype}; expected bool, int or 0/1 floats")
    for role, t in named + [("response_mask", mask)]:
        if t.dim() != 2:
            raise RolloutFileError(f"{_label(keys[role], role)} has shape {tuple(t.shape)}; every key must be "
                                   "[batch, tokens] (2-D)")
    for role, t in named[1:] + [("response_mask", mask)]:
        if t.shape != lp.shape:
            raise RolloutFileError(f"shape mismatch: '{keys[role]}' is {tuple(t.shape)} but '{keys['logprob']}' is "
                                   f"{tuple(lp.shape)}; they must match token by token")
    if lp.numel() == 0:
        raise RolloutFileError(f"the batch is empty (shape {tuple(lp.shape)})")
    m = mask
    if m.dtype != torch.bool:
        mf = m.double()
        if not bool(torch.isfinite(mf).all()) or not bool(((mf == 0) | (mf == 1)).all()):
            bad = mf[~((mf == 0) | (mf == 1))]
            raise RolloutFileError(f"{_label(keys['response_mask'], 'response_mask')} must hold only 0 and 1; found "
                                   f"{bad.numel()} other value(s), e.g. {float(bad[0]):g}")
        m = mf == 1
    if not bool(m.any()):
        raise RolloutFileError(f"{_label(keys['response_mask'], 'response_mask')} selects no token: nothing to diagnose")
    dtypes = {role: str(t.dtype).replace("torch.", "") for role, t in named + [("response_mask", mask)]}
    return Rollouts(logprob=lp.double(), ref_logprob=ref.double(), mask=m,
                    old_logprob=None if old is None else old.double(), source=source, keys=dict(keys), dtypes=dtypes)


def save_rollouts(path: str | Path, logprob: Any, ref_logprob: Any, response_mask: Any, old_logprob: Any = None) -> Path:
    """Write a rollout dump that ``klviz diagnose`` reads: ``.npz``, ``.pt`` or ``.safetensors`` by suffix.

    Inputs are ``[batch, tokens]`` tensors or arrays; log-probs are stored as float32 (pass float64
    arrays to an ``.npz`` yourself if you need more), the mask as int8 0/1.
    """
    p = Path(path)
    r = rollouts_from_tensors(logprob, ref_logprob, response_mask, old_logprob)
    data = {"logprob": r.logprob.float(), "ref_logprob": r.ref_logprob.float(), "response_mask": r.mask.to(torch.int8)}
    if r.old_logprob is not None:
        data["old_logprob"] = r.old_logprob.float()
    suffix = p.suffix.lower()
    if suffix == ".npz":
        np.savez_compressed(p, **{k: v.numpy() for k, v in data.items()})
    elif suffix in (".pt", ".pth"):
        torch.save(data, p)
    elif suffix == ".safetensors":
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise ValueError("writing .safetensors needs the 'safetensors' package; use .npz or .pt instead") from None
        save_file({k: v.contiguous() for k, v in data.items()}, str(p))
    else:
        raise ValueError(f"path must end in one of {', '.join(_SUFFIXES)}, got {p.name!r}")
    return p


# ---------------------------------------------------------------------------------------------
# analysis
# ---------------------------------------------------------------------------------------------

#: The clamps frameworks apply to the per-token estimate, as (description, test for "this token is altered").
CLAMPS: dict[str, str] = {
    "verl low_var_kl: log r clamped to ±20": "k3_in",
    "verl low_var_kl: k3 clamped to ≤ 10 (also NeMo-RL)": "k3_out",
    "OpenRLHF k1 clamped to ±10": "k1_10",
    "OpenRLHF k2 clamped to ≤ 10": "k2_10",
    "OpenRLHF k3 clamped to ≤ 10": "k3_10",
    "open-instruct log r clamped to ±40": "lr_40",
}


def cluster_mean_se(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Token-mean of ``values`` over ``mask`` and its standard error, treating *sequences* (rows) as
    the independent units (tokens of one response are correlated). Returns (mean, se)."""
    w = mask.double()
    v = torch.where(mask, values.double(), torch.zeros((), dtype=torch.float64))
    n_i = w.sum(-1)
    s_i = (v * w).sum(-1)
    keep = n_i > 0
    n_i, s_i = n_i[keep], s_i[keep]
    total = float(n_i.sum())
    mean = float(s_i.sum()) / total
    b = int(keep.sum())
    if b < 2:
        return mean, math.nan
    resid = s_i - mean * n_i
    se = math.sqrt(float(resid.square().sum()) * b / (b - 1)) / total
    return mean, se


def _mean_se(x: torch.Tensor) -> tuple[float, float]:
    n = x.numel()
    if n == 0:
        return math.nan, math.nan
    mean = float(x.mean())
    return mean, (float(x.std()) / math.sqrt(n) if n > 1 else math.nan)


def _estimates(log_r: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"k1": -log_r, "k2": 0.5 * log_r.square(), "k3": torch.expm1(log_r) - log_r}


@dataclass
class Diagnosis:
    """Everything the report says, as numbers (see :func:`diagnose`)."""

    source: str
    shape: tuple[int, int]
    dtypes: dict[str, str]
    keys: dict[str, str]
    n_tokens: int                    # counted, finite tokens
    n_sequences: int                 # sequences with at least one counted token
    n_empty_sequences: int
    lengths: dict[str, float]
    sampler: str                     # "policy" or "old policy"
    off_policy: bool
    max_abs_policy_shift: float      # max |logprob - old_logprob| (0 when on-policy)
    nonfinite: dict[str, int]        # counted tokens with NaN/inf, per role
    nonfinite_examples: list[tuple[str, int, int, float]]
    positive_logprobs: dict[str, int]
    estimates: dict[str, dict[str, float]]      # k1/k2/k3 -> statistics (reference KL)
    directions: dict[str, str]
    extra: dict[str, dict[str, float]]          # other estimates (ppo_kl, importance-weighted, ...)
    mean_ratio: tuple[float, float]             # mean of r = exp(ref - sampler) and its SE
    clamps: dict[str, dict[str, float]]
    large_tokens: list[tuple[int, int, float]]  # (row, column, log r) of the largest |log r|
    n_large: int
    k3_top_share: float                         # share of the k3 sum carried by the top 1% of tokens
    trouble: list[tuple[str, str]] = field(default_factory=list)   # (title, advice)
    # per-token and per-sequence values, kept for plotting
    log_r: torch.Tensor | None = None
    valid: torch.Tensor | None = None

    @property
    def has_nonfinite(self) -> bool:
        return sum(self.nonfinite.values()) > 0


def diagnose(r: Rollouts) -> Diagnosis:
    """Analyse a batch of rollouts: estimates, their directions, clamps and trouble signs."""
    lp, ref, mask, old = r.logprob, r.ref_logprob, r.mask, r.old_logprob
    roles = {"logprob": lp, "ref_logprob": ref} | ({"old_logprob": old} if old is not None else {})
    finite = torch.ones_like(mask)
    nonfinite: dict[str, int] = {}
    examples: list[tuple[str, int, int, float]] = []
    for role, t in roles.items():
        bad = mask & ~torch.isfinite(t)
        nonfinite[role] = int(bad.sum())
        for i, j in bad.nonzero().tolist()[:3]:
            examples.append((role, i, j, float(t[i, j])))
        finite &= torch.isfinite(t)
    valid = mask & finite
    if not bool(valid.any()):
        raise RolloutFileError("every counted token has a NaN or inf log-prob: nothing left to diagnose")
    positive = {role: int((valid & (t > 1e-3)).sum()) for role, t in roles.items()}

    lengths_all = mask.sum(-1)
    n_i = valid.sum(-1)
    kept = n_i > 0
    lengths = {"min": float(lengths_all[kept].min()), "median": float(lengths_all[kept].double().median()),
               "max": float(lengths_all[kept].max()), "mean": float(lengths_all[kept].double().mean())}

    shift = float((lp - old)[valid].abs().max()) if old is not None else 0.0
    off_policy = old is not None and shift > 1e-6
    sampler_lp = old if off_policy else lp
    sampler = "old policy (old_logprob)" if off_policy else "policy (logprob)"

    zero = torch.zeros((), dtype=torch.float64)
    log_r = torch.where(valid, ref - lp, zero)          # target ref, over the policy: k_n of KL(pi||ref)
    per_token = _estimates(log_r)
    estimates: dict[str, dict[str, float]] = {}
    vals_masked = {}
    for name, v in per_token.items():
        tm, tse = cluster_mean_se(v, valid)
        seq_sum = torch.where(valid, v, zero).sum(-1)[kept]
        seq_mean = seq_sum / n_i[kept]
        sm, sse = _mean_se(seq_sum)
        mm, mse = _mean_se(seq_mean)
        x = v[valid]
        vals_masked[name] = x
        q = torch.quantile(x, torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64)) if x.numel() <= 16_000_000 else None
        estimates[name] = {
            "token_mean": tm, "token_mean_se": tse, "seq_sum_mean": sm, "seq_sum_se": sse,
            "seq_token_mean": mm, "seq_token_mean_se": mse, "token_std": float(x.std()) if x.numel() > 1 else 0.0,
            "min": float(x.min()), "max": float(x.max()),
            "p01": float(q[0]) if q is not None else math.nan, "p50": float(q[1]) if q is not None else math.nan,
            "p99": float(q[2]) if q is not None else math.nan,
            "frac_negative": float((x < 0).double().mean()),
        }

    directions: dict[str, str] = {}
    extra: dict[str, dict[str, float]] = {}
    if not off_policy:
        for name in ("k1", "k3"):
            directions[name] = "KL(π ‖ π_ref), unbiased (tokens sampled by π)"
        directions["k2"] = "KL(π ‖ π_ref) to second order; biased upward or downward as π and π_ref separate"
    else:
        directions["k1"] = ("KL(π_old ‖ π_ref) − KL(π_old ‖ π) on average: neither KL(π ‖ π_ref) nor KL(π_old ‖ π_ref), "
                            "because the tokens came from π_old")
        directions["k2"] = "no KL in particular (tokens from π_old, log-probs from π): biased"
        directions["k3"] = "no KL in particular (tokens from π_old, log-probs from π): biased"
        rho = torch.where(valid, torch.exp(lp - old), zero)
        lr_old = torch.where(valid, lp - old, zero)           # target π, sampler π_old
        for nm, vals, what in (
            ("ppo_kl k1 (old − new)", -lr_old, "KL(π_old ‖ π), unbiased: PPO's ppo_kl / approx_kl"),
            ("k3 of π vs π_old", torch.expm1(lr_old) - lr_old, "KL(π_old ‖ π), unbiased, ≥ 0"),
            ("ρ·k1, ρ = π/π_old", rho * per_token["k1"], "KL(π ‖ π_ref), unbiased with importance weights"),
            ("ρ·k3, ρ = π/π_old", rho * per_token["k3"], "KL(π ‖ π_ref), unbiased with importance weights"),
            ("sampler k1 (old − ref)", torch.where(valid, old - ref, zero), "KL(π_old ‖ π_ref), unbiased"),
        ):
            m, se = cluster_mean_se(vals, valid)
            extra[nm] = {"token_mean": m, "token_mean_se": se}
            directions[nm] = what
        rm, rse = cluster_mean_se(rho, valid)
        extra["mean ρ = π/π_old"] = {"token_mean": rm, "token_mean_se": rse}
        directions["mean ρ = π/π_old"] = "1 on average when the tokens were sampled by π_old"

    ratio = torch.where(valid, torch.exp(ref - sampler_lp), zero)
    mean_ratio = cluster_mean_se(ratio, valid)

    d = log_r[valid]
    k3_in = d.clamp(-20, 20)
    k3_clamped_in = torch.expm1(k3_in) - k3_in
    tests = {
        "k3_in": d.abs() > 20,
        "k3_out": k3_clamped_in > 10,
        "k1_10": d.abs() > 10,
        "k2_10": 0.5 * d.square() > 10,
        "k3_10": vals_masked["k3"] > 10,
        "lr_40": d.abs() > 40,
    }
    clamped_values = {
        "k3_in": k3_clamped_in, "k3_out": k3_clamped_in.clamp(max=10),
        "k1_10": vals_masked["k1"].clamp(-10, 10), "k2_10": vals_masked["k2"].clamp(max=10),
        "k3_10": vals_masked["k3"].clamp(max=10), "lr_40": torch.expm1(d.clamp(-40, 40)) - d.clamp(-40, 40),
    }
    base = {"k3_in": "k3", "k3_out": "k3", "k1_10": "k1", "k2_10": "k2", "k3_10": "k3", "lr_40": "k3"}
    clamps = {}
    for label, code in CLAMPS.items():
        hit = tests[code]
        shift_mean = float(clamped_values[code].mean()) - float(vals_masked[base[code]].mean())
        clamps[label] = {"fraction": float(hit.double().mean()), "count": int(hit.sum()), "mean_shift": shift_mean}

    absd = log_r.abs().masked_fill(~valid, -1.0)
    n_large = int((absd > LARGE_LOG_RATIO).sum())
    top = torch.topk(absd.flatten(), k=min(5, int(valid.sum())))
    width = lp.shape[1]
    large = [(int(i) // width, int(i) % width, float(log_r.flatten()[i])) for i in top.indices if absd.flatten()[i] >= 0]
    k3v = vals_masked["k3"]
    k_top = max(1, int(math.ceil(0.01 * k3v.numel())))
    k3_sum = float(k3v.sum())
    share = float(torch.topk(k3v, k_top).values.sum()) / k3_sum if k3_sum > 0 else 0.0

    diag = Diagnosis(
        source=r.source, shape=r.shape, dtypes=r.dtypes, keys=r.keys, n_tokens=int(valid.sum()),
        n_sequences=int(kept.sum()), n_empty_sequences=int((mask.sum(-1) == 0).sum()), lengths=lengths,
        sampler=sampler, off_policy=off_policy, max_abs_policy_shift=shift, nonfinite=nonfinite,
        nonfinite_examples=examples, positive_logprobs=positive, estimates=estimates, directions=directions,
        extra=extra, mean_ratio=mean_ratio, clamps=clamps, large_tokens=large, n_large=n_large,
        k3_top_share=share, log_r=log_r, valid=valid)
    diag.trouble = _trouble(diag)
    return diag


def _trouble(d: Diagnosis) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if d.has_nonfinite:
        parts = ", ".join(f"{n} in '{d.keys.get(role, role)}'" for role, n in d.nonfinite.items() if n)
        ex = "; ".join(f"{role}[{i}, {j}] = {v}" for role, i, j, v in d.nonfinite_examples[:3])
        out.append((f"NaN or inf log-probs at counted tokens ({parts}; e.g. {ex})",
                    "These tokens were left out of every number above. A -inf reference log-prob means the reference "
                    "gives the token probability 0, so KL(π‖π_ref) is infinite there; NaN usually comes from an "
                    "overflow in the forward pass or from a mask that does not cover padding. Fix the source before "
                    "trusting the KL."))
    pos = {k: v for k, v in d.positive_logprobs.items() if v}
    if pos:
        out.append((f"positive log-probs ({', '.join(f'{v} in {k}' for k, v in pos.items())})",
                    "A log-probability is ≤ 0. Positive values mean these are logits, scores or log-probs summed "
                    "with something else: check which tensor you saved."))
    if d.n_large:
        worst = ", ".join(f"[{i}, {j}] log r = {v:+.1f}" for i, j, v in d.large_tokens[:3])
        out.append((f"{d.n_large} token(s) with |log r| > {LARGE_LOG_RATIO:g} (largest: {worst})",
                    "A ratio beyond e^10 means policy and reference disagree completely on these tokens. k3 grows like "
                    "e^|log r| when log r > 0 and the frameworks' clamps start to bind (see the clamp table); k1 stays "
                    "linear. Look at these tokens: often a special token, a tokenizer mismatch, or a prompt token "
                    "that the mask should have excluded."))
    k1 = d.estimates["k1"]
    if k1["token_mean"] < 0:
        z = -k1["token_mean"] / k1["token_mean_se"] if k1["token_mean_se"] > 0 else math.inf
        shown = f"{k1['token_mean']:.4g} ± {2 * k1['token_mean_se']:.2g}"
        if d.off_policy:
            out.append((f"the k1 mean is negative ({shown})",
                        "Expected off-policy: on π_old's tokens E[log π − log π_ref] = KL(π_old‖π_ref) − KL(π_old‖π), "
                        "which is negative once π has moved further from π_old than π_old is from π_ref. It is not a KL; "
                        "use the ρ-weighted rows."))
        elif z > 3:
            out.append((f"the k1 mean is negative beyond noise ({shown})",
                        "On-policy, E[k1] = KL(π‖π_ref) ≥ 0, so a clearly negative mean says the tokens were not "
                        "drawn from the distribution whose log-probs you saved: sampling temperature, top-p/top-k, a "
                        "different inference engine (vLLM vs the trainer), or stale/off-policy tokens."))
        else:
            out.append((f"the k1 mean is negative but within noise ({shown})",
                        "Expected when π and π_ref are close: k1 is negative on every token π_ref likes more than π, "
                        "and the true KL is small next to the noise. Nothing is wrong; k3 is never negative."))
    rm, rse = d.mean_ratio
    if math.isfinite(rse) and abs(rm - 1) > max(4 * rse, 0.01):
        out.append((f"the mean ratio r = π_ref/π_sampler is {rm:.4f} ± {2 * rse:.2g}, not 1",
                    "E[r] = 1 exactly when the tokens are samples of the sampler's distribution, so k1 and k3 (whose "
                    "difference is 1 − r) disagree here by more than noise. The saved log-probs do not describe the "
                    "distribution the tokens were drawn from (temperature, top-p, engine mismatch), or the reference "
                    "misses part of the support. Treat the k3 value with care."))
    k3 = d.estimates["k3"]
    if k3["token_std"] > 2 * k1["token_std"] or d.k3_top_share > 0.5:
        out.append((f"k3 is heavy-tailed (per-token std {k3['token_std']:.3g} vs k1's {k1['token_std']:.3g}; "
                    f"top 1% of tokens carry {100 * d.k3_top_share:.0f}% of its sum)",
                    "k3 = r − 1 − log r contains r = π_ref/π, exponential in log r: on tokens that π_ref finds "
                    "far likelier than π, one token outweighs hundreds (for Gaussians Var k3 grows like e^{μ²}). "
                    "The batch value then rests on a few tokens; k1 is the steadier number to log here, or look at "
                    "those tokens."))
    if d.off_policy:
        out.append((f"the tokens were sampled by π_old, not π (max |logprob − old_logprob| = {d.max_abs_policy_shift:.3g})",
                    "k1/k2/k3 of logprob vs ref_logprob then estimate no KL exactly; weight by ρ = π/π_old (the ρ·k rows) "
                    "for KL(π‖π_ref), or compare old_logprob with ref_logprob for KL(π_old‖π_ref)."))
    if d.n_empty_sequences:
        out.append((f"{d.n_empty_sequences} sequence(s) have no counted token",
                    "They are left out of the per-sequence means (as recent verl does); check that the mask is not "
                    "shifted by one or empty for truncated responses."))
    ks = d.estimates
    if all(abs(ks[k]["max"]) == 0 and abs(ks[k]["min"]) == 0 for k in ks):
        out.append(("policy and reference log-probs are identical",
                    "KL = 0: expected at step 0, before the first update. Later it means the reference is the policy "
                    "itself (or the same tensor was saved twice)."))
    return out


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "  n/a" if math.isnan(x) else str(x)
    return f"{x:.4g}"


def format_report(d: Diagnosis) -> str:
    """The plain-text report ``klviz diagnose`` prints."""
    b, t = d.shape
    lines = [
        f"klviz diagnose: {d.source}",
        f"  shape [batch {b}, tokens {t}]; dtypes " + ", ".join(f"{d.keys.get(k, k)}={v}" for k, v in d.dtypes.items()),
        f"  counted tokens {d.n_tokens:,} in {d.n_sequences} sequences; response length min {d.lengths['min']:.0f}, "
        f"median {d.lengths['median']:.0f}, max {d.lengths['max']:.0f}",
        f"  tokens sampled by: {d.sampler}"
        + ("" if d.off_policy or "old_logprob" in d.keys else " (no old_logprob key: assumed on-policy, the first PPO minibatch)"),
        "",
        "Per-token estimates with log r = ref_logprob − logprob  (mean ± 2 SE; SE counts sequences as the independent units)"
        + ("\n  (tokens from π_old: these are biased, see 'Off-policy estimates')" if d.off_policy else ""),
        f"  {'':4}{'token-mean':>22}{'seq-mean-token-mean':>24}{'seq-mean-token-sum':>24}{'std/token':>11}"
        f"{'p1':>11}{'p50':>11}{'p99':>11}{'max':>11}",
    ]
    for k in ("k1", "k2", "k3"):
        e = d.estimates[k]
        lines.append(
            f"  {k:4}{_fmt(e['token_mean']) + ' ± ' + _fmt(2 * e['token_mean_se']):>22}"
            f"{_fmt(e['seq_token_mean']) + ' ± ' + _fmt(2 * e['seq_token_mean_se']):>24}"
            f"{_fmt(e['seq_sum_mean']) + ' ± ' + _fmt(2 * e['seq_sum_se']):>24}{_fmt(e['token_std']):>11}"
            f"{_fmt(e['p01']):>11}{_fmt(e['p50']):>11}{_fmt(e['p99']):>11}{_fmt(e['max']):>11}")
    lines += ["  (verl's kl_loss with loss_agg_mode token-mean is the first column; verl's in-reward metric "
              "actor/reward_kl_penalty is the second; TRL PPO's logged KL is the third, a sequence KL)", "",
              "What each number estimates"]
    for k, what in d.directions.items():
        lines.append(f"  {k}: {what}")
    if d.extra:
        lines += ["", "Off-policy estimates (tokens from π_old)"]
        for k, e in d.extra.items():
            lines.append(f"  {k:26} {_fmt(e['token_mean'])} ± {_fmt(2 * e['token_mean_se'])}")
    e1, e2, e3 = (d.estimates[k] for k in ("k1", "k2", "k3"))
    rm, rse = d.mean_ratio
    lines += ["", "Agreement between estimators",
              f"  k1 − k3 (token-mean) = {_fmt(e1['token_mean'] - e3['token_mean'])} = mean(1 − π_ref/π) over the tokens",
              f"  mean of π_ref/π_sampler = {rm:.4f} ± {_fmt(2 * rse)} (1 in expectation when the tokens are samples of "
              "the sampler whose log-probs you saved)",
              f"  k2 − k3 = {_fmt(e2['token_mean'] - e3['token_mean'])} (k2's bias; third order in log r when π ≈ π_ref)",
              f"  k1 negative on {100 * e1['frac_negative']:.1f}% of tokens (expected: the tokens π_ref prefers)", "",
              "Clamps: fraction of counted tokens each framework's clamp would alter, and how much it moves the token-mean",
              "  (clamped minus unclamped; verl's second row is low_var_kl with both of its clamps)"]
    for label, c in d.clamps.items():
        lines.append(f"  {label:52} {100 * c['fraction']:7.3f}%  ({c['count']} tokens)  mean shift {c['mean_shift']:+.3g}")
    lines += ["", "Trouble signs"]
    if not d.trouble:
        lines.append("  none found: finite log-probs, no huge ratios, estimators agree within noise.")
    for i, (title, advice) in enumerate(d.trouble, 1):
        lines.append(f"  {i}. {title}")
        lines.append(f"     → {advice}")
    return "\n".join(lines)


def plot_report(d: Diagnosis, path: str | Path | None = None):
    """A four-panel figure of the diagnosis; saved as PNG to ``path`` when given. Returns the figure."""
    from .plotting import COLORS, new_figure

    fig, axes = new_figure(9.0, 6.4, nrows=2, ncols=2)
    (ax_lr, ax_k), (ax_seq, ax_bar) = axes
    assert d.log_r is not None and d.valid is not None
    lr = d.log_r[d.valid].numpy()
    lo, hi = float(np.min(lr)), float(np.max(lr))
    span = max(hi - lo, 1e-6)
    ax_lr.hist(lr, bins=60, range=(lo - 0.02 * span, hi + 0.02 * span), color=COLORS["q"], alpha=0.9)
    ax_lr.set_yscale("log")
    for x in (-10, 10, -20, 20):
        if lo - 0.02 * span <= x <= hi + 0.02 * span:
            ax_lr.axvline(x, color=COLORS["mu"], ls="--", lw=1)
    ax_lr.set_xlabel("log r = log π_ref − log π  (per token)")
    ax_lr.set_ylabel("tokens")
    ax_lr.set_title(f"per-token log-ratio ({d.n_tokens:,} tokens)")

    ests = _estimates(torch.as_tensor(lr))
    top = max(float(np.quantile(ests[k].numpy(), 0.999)) for k in ("k2", "k3"))
    low = float(np.quantile(ests["k1"].numpy(), 0.001))
    bins = np.linspace(min(low, 0.0), max(top, float(np.quantile(ests["k1"].numpy(), 0.999)), 1e-3), 60)
    for k in ("k1", "k2", "k3"):
        ax_k.hist(np.clip(ests[k].numpy(), bins[0], bins[-1]), bins=bins, histtype="step", lw=1.6,
                  color=COLORS[k], label=k)
    ax_k.set_yscale("log")
    ax_k.set_xlabel("per-token value [nats] (clipped to the 0.1–99.9% range)")
    ax_k.set_ylabel("tokens")
    ax_k.set_title("per-token k1, k2, k3")
    ax_k.legend()

    valid = d.valid
    lengths = valid.sum(-1).numpy()
    keep = lengths > 0
    zero = torch.zeros((), dtype=torch.float64)
    full = _estimates(d.log_r)
    for k in ("k1", "k3"):
        s = torch.where(valid, full[k], zero).sum(-1).numpy()
        ax_seq.scatter(lengths[keep], s[keep], s=12, alpha=0.7, color=COLORS[k], label=f"{k} summed over the response")
    ax_seq.axhline(0, color="black", lw=0.6)
    ax_seq.set_xlabel("counted tokens in the response")
    ax_seq.set_ylabel("sequence KL estimate [nats]")
    ax_seq.set_title("per-sequence sums vs length")
    ax_seq.legend()

    modes = [("token_mean", "token-mean"), ("seq_token_mean", "seq-mean-\ntoken-mean")]
    width = 0.25
    for i, k in enumerate(("k1", "k2", "k3")):
        e = d.estimates[k]
        xs = np.arange(len(modes)) + (i - 1) * width
        ys = [e[m] for m, _ in modes]
        errs = [2 * e[m + "_se"] if math.isfinite(e[m + "_se"]) else 0.0 for m, _ in modes]
        ax_bar.bar(xs, ys, width=width, color=COLORS[k], label=k, yerr=errs, capsize=3)
    ax_bar.axhline(0, color="black", lw=0.6)
    ax_bar.set_xticks(np.arange(len(modes)), [lab for _, lab in modes])
    ax_bar.set_ylabel("KL(π ‖ π_ref) estimate [nats/token]")
    ax_bar.set_title("batch estimates ± 2 SE")
    ax_bar.legend()
    fig.suptitle(f"klviz diagnose: {Path(d.source).name}  ·  {len(d.trouble)} trouble sign(s)", fontsize=11)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
