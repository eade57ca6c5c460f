"""The format guide's verl and OpenRLHF snippets run as written, on stand-in batches with the attribute names
of the upstream code they cite (verl @ 1dda039 ``RayPPOTrainer.fit``; OpenRLHF @ 3c3be62
``RemoteExperienceMaker.make_experience``), and write dumps ``klviz diagnose`` reads with the default keys."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from klviz import diagnose as dg


def _recipe(name: str) -> str:
    guide = dg.format_guide_path().read_text(encoding="utf-8")
    m = re.search(rf"<!-- recipe: {name} -->\s*```python\n(.*?)```", guide, flags=re.S)
    assert m, f"no recipe {name!r} in the format guide"
    return m.group(1)


def _logprobs(g, B=6, T=10):
    lp = -torch.empty(B, T).exponential_(1.0, generator=g) - 0.01
    ref = (lp + 0.2 * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    mask = (torch.arange(T)[None] < torch.randint(3, T + 1, (B,), generator=g)[:, None]).to(torch.int64)
    return lp, ref, mask


@pytest.mark.parametrize("with_rollout", [False, True])
def test_verl_recipe(tmp_path, monkeypatch, with_rollout):
    g = torch.Generator().manual_seed(0)
    lp, ref, mask = _logprobs(g)
    batch = {  # DataProto.batch is a TensorDict: [] and .keys() as on a dict
        "old_log_probs": lp,
        "ref_log_prob": ref,
        "response_mask": mask,
        "responses": torch.randint(0, 50, lp.shape, generator=g),
        "prompts": torch.randint(0, 50, (lp.shape[0], 4), generator=g),
    }
    if with_rollout:
        batch["rollout_log_probs"] = (lp + 0.01 * torch.randn(lp.shape, generator=g)).clamp(max=-1e-4)
    monkeypatch.chdir(tmp_path)
    scope = {"self": SimpleNamespace(global_steps=50), "batch": SimpleNamespace(batch=batch), "torch": torch}
    exec(_recipe("verl"), scope)
    d = dg.diagnose(tmp_path / "kl_dump_step50.pt")
    assert d.step == 50 and ("rollout_logprob" in d.keys) == with_rollout and not d.off_policy
    assert d.estimates["k1"]["token_mean"] == pytest.approx(float(((lp - ref) * mask).sum() / mask.sum()), rel=1e-6)


@pytest.mark.parametrize("case", ["reward", "correction", "init_coef 0"])
def test_openrlhf_recipe(tmp_path, monkeypatch, case):
    g = torch.Generator().manual_seed(1)
    lp, ref, mask = _logprobs(g)
    sequences = torch.randint(0, 50, (lp.shape[0], 5 + lp.shape[1]), generator=g)
    rollout = (lp + 0.01 * torch.randn(lp.shape, generator=g)).clamp(max=-1e-4) if case == "correction" else None
    samples = SimpleNamespace(action_mask=mask.bool(), sequences=sequences, rollout_log_probs=rollout)
    scope = {
        "self": SimpleNamespace(klviz_step=7),
        "i": 0,
        "samples": samples,
        "action_log_probs": lp,
        "base_action_log_probs": None if case == "init_coef 0" else ref,  # OpenRLHF's stand-in without a ref model
        "torch": torch,
    }
    monkeypatch.chdir(tmp_path)
    exec(_recipe("openrlhf"), scope)
    written = list(tmp_path.glob("*.pt"))
    if case == "init_coef 0":
        assert written == []
        return
    d = dg.diagnose(tmp_path / "kl_dump_step7_part0.pt")
    assert d.step == 7 and ("rollout_logprob" in d.keys) == (case == "correction")
    assert d.n_tokens == int(mask.sum())
