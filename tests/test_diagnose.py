"""Tests of ``klviz diagnose``: safe loading, validation, the numbers of the report, the CLI contract."""
from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

import klviz
from klviz import cli
from klviz import diagnose as dg


# -- synthetic rollouts with a known exact KL --------------------------------------------------

def _batch(seed=0, B=24, T=30, V=40, spread=0.4, sampler_temp=1.0, old_shift=0.0):
    """Tokens sampled from pi (or from pi_old when old_shift > 0) with the exact per-position KL."""
    g = torch.Generator().manual_seed(seed)
    pol = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 1.5
    ref = pol + spread * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    old = pol + old_shift * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    lpol, lref, lold = pol.log_softmax(-1), ref.log_softmax(-1), old.log_softmax(-1)
    sampler = (old / sampler_temp).softmax(-1)
    x = torch.multinomial(sampler.reshape(-1, V), 1, generator=g).reshape(B, T, 1)
    L = torch.randint(3, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < L[:, None]).to(torch.int64)
    exact = (lpol.exp() * (lpol - lref)).sum(-1)          # KL(pi || ref) per position
    return {
        "logprob": lpol.gather(-1, x)[..., 0].float(), "ref_logprob": lref.gather(-1, x)[..., 0].float(),
        "response_mask": mask, "old_logprob": lold.gather(-1, x)[..., 0].float(),
        "exact_token_mean": float((exact * mask).sum() / mask.sum()),
    }


@pytest.fixture
def good(tmp_path):
    b = _batch()
    path = tmp_path / "good.npz"
    dg.save_rollouts(path, b["logprob"], b["ref_logprob"], b["response_mask"])
    return path, b


def run_cli(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err):
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("klviz: error:")
    assert "Traceback" not in err


# -- good files --------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".npz", ".pt", ".safetensors"])
def test_good_dump_each_format(tmp_path, capsys, suffix):
    b = _batch(seed=1)
    path = dg.save_rollouts(tmp_path / f"roll{suffix}", b["logprob"], b["ref_logprob"], b["response_mask"])
    code, out, err = run_cli(["diagnose", str(path)], capsys)
    assert code == 0, err
    assert err == ""
    for text in ("k1", "k2", "k3", "token-mean", "KL(π ‖ π_ref)", "Clamps", "Trouble signs", "assumed on-policy"):
        assert text in out


def test_numbers_match_independent_computation(good):
    path, b = good
    d = dg.diagnose(dg.load_rollouts(path))
    lp, ref, mask = b["logprob"].double(), b["ref_logprob"].double(), b["response_mask"]
    for kind, name in (("k1", "k1"), ("k2", "k2"), ("k3", "k3")):
        per_token = klviz.kl_penalty(lp, ref, kind).double()
        expected = float(klviz.masked_mean(per_token, mask))
        assert d.estimates[name]["token_mean"] == pytest.approx(expected, rel=1e-6, abs=1e-10)
        seq_mean = float(klviz.agg_loss(per_token, mask, "seq-mean-token-mean"))
        assert d.estimates[name]["seq_token_mean"] == pytest.approx(seq_mean, rel=1e-6, abs=1e-10)
        seq_sum = float(klviz.agg_loss(per_token, mask, "seq-mean-token-sum"))
        assert d.estimates[name]["seq_sum_mean"] == pytest.approx(seq_sum, rel=1e-6, abs=1e-10)
    assert d.n_tokens == int(mask.sum())


def test_unbiased_estimates_agree_with_exact_kl():
    b = _batch(seed=3, B=64, T=30)
    d = dg.diagnose(dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"]))
    for k in ("k1", "k3"):
        e = d.estimates[k]
        assert abs(e["token_mean"] - b["exact_token_mean"]) < 4 * e["token_mean_se"]
    assert abs(d.mean_ratio[0] - 1) < 4 * d.mean_ratio[1]
    assert not any("not 1" in t for t, _ in d.trouble)


def test_cluster_se_equals_sequence_se_for_equal_lengths():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(50, 8, generator=g, dtype=torch.float64)
    mask = torch.ones(50, 8, dtype=torch.bool)
    m, se = klviz.statistics.clustered_mean_se(v, mask)
    seq = v.mean(-1)
    assert m == pytest.approx(float(seq.mean()))
    assert se == pytest.approx(float(seq.std()) / math.sqrt(50), rel=1e-9)


def test_off_policy_tokens_use_importance_weights():
    b = _batch(seed=5, B=96, T=30, old_shift=0.5)
    r = dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"], b["old_logprob"])
    d = dg.diagnose(r)
    assert d.off_policy and "old" in d.sampler
    iw = d.extra["ρ·k1, ρ = π/π_old"]
    assert abs(iw["token_mean"] - b["exact_token_mean"]) < 4 * iw["token_mean_se"]
    rho = d.extra["mean ρ = π/π_old"]
    assert abs(rho["token_mean"] - 1) < 4 * rho["token_mean_se"]
    assert "neither" in d.directions["k1"]
    assert any("sampled by π_old" in t for t, _ in d.trouble)


def test_old_equal_to_policy_is_on_policy(good):
    path, b = good
    r = dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"], b["logprob"])
    assert not dg.diagnose(r).off_policy


def test_sampling_mismatch_is_flagged():
    # tokens drawn at temperature 0.3 but scored at temperature 1: E[r] != 1 and k1 != k3
    b = _batch(seed=7, B=256, T=30, sampler_temp=0.3, spread=1.0)
    d = dg.diagnose(dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"]))
    assert any("mean ratio" in t for t, _ in d.trouble)


def test_clamp_fractions_and_large_tokens():
    lp = torch.full((2, 5), -1.0, dtype=torch.float64)
    ref = lp.clone()
    ref[0, 0] = -1.0 + 12.0        # log r = +12: k1 = -12 (OpenRLHF clamps), k3 = e^12 - 13 (> 10)
    ref[0, 1] = -1.0 - 25.0        # log r = -25: verl's input clamp acts; k3 = 24 + e^-25 > 10
    ref[1, 0] = -1.0 + 5.0         # log r = 5: k3 = e^5 - 6 ≈ 142 > 10, k1 = -5 not clamped
    mask = torch.ones(2, 5, dtype=torch.bool)
    d = dg.diagnose(dg.rollouts_from_tensors(lp, ref, mask))
    frac = {label: v["count"] for label, v in d.clamps.items()}
    assert frac["verl low_var_kl: log r clamped to ±20 (also NeMo-RL)"] == 1
    assert frac["verl low_var_kl: k3 clamped to ≤ 10 (also NeMo-RL)"] == 3
    assert frac["OpenRLHF: k1 clamped to ±10"] == 2
    assert frac["OpenRLHF: k2 clamped to ≤ 10"] == 3     # ½·25 = 12.5 > 10 too
    assert frac["OpenRLHF: k3 clamped to ≤ 10"] == 3
    assert frac["open-instruct: log r clamped to ±40"] == 0
    # NeMo-RL clamps k1 and k2 too; its ±20 input clamp cannot act once the ±10 output clamp has
    assert d.clamps["NeMo-RL: k1 clamped to ±10"] == d.clamps["OpenRLHF: k1 clamped to ±10"]
    assert d.clamps["NeMo-RL: k2 clamped to ≤ 10"] == d.clamps["OpenRLHF: k2 clamped to ≤ 10"]
    assert d.n_large == 2
    assert {(i, j) for i, j, _ in d.large_tokens[:2]} == {(0, 0), (0, 1)}
    # verl's low_var_kl (both clamps) vs raw k3: each clamped token contributes (10 - k3) / 10 tokens
    k3 = lambda x: math.expm1(x) - x  # noqa: E731
    expected = ((10 - k3(12)) + (10 - k3(-25)) + (10 - k3(5))) / 10
    assert d.clamps["verl low_var_kl: k3 clamped to ≤ 10 (also NeMo-RL)"]["mean_shift"] == pytest.approx(expected, rel=1e-9)
    assert any("|log r| > 10" in t for t, _ in d.trouble)


def test_clamp_rows_come_from_the_framework_rules():
    from klviz.framework_rules import CLAMP_RULES

    rows = dg.clamp_rows()
    used = {rule.name for rule, _name, _kind in rows.values()}
    acting = {r.name for r in CLAMP_RULES.values() if any(r.acts_on(k) for k in ("k1", "k2", "k3"))}
    # every rule that clamps something heads a row (NeMo-RL also shares verl's k3 rows: same clamps)
    assert used == acting and "none" not in used
    assert sum("(also NeMo-RL)" in label for label in rows) == 2
    for label, (rule, name, kind) in rows.items():
        assert rule.acts_on(name)
        assert (rule.input_clamp if kind == "input" else rule.output_clamp) is not None, label
    # a rule's clamps are the ones the table measures: the verl row equals ClampRule.apply by hand
    lr = torch.tensor([[-25.0, 0.3, 12.0, 5.0]], dtype=torch.float64)
    d = dg.diagnose(dg.rollouts_from_tensors(-torch.ones_like(lr), lr - 1, torch.ones_like(lr)))
    rule = CLAMP_RULES["verl low_var_kl"]
    shift = float(rule.apply(lr.flatten(), "k3").mean() - klviz.kernel.k3(lr.flatten()).mean())
    row = d.clamps["verl low_var_kl: k3 clamped to ≤ 10 (also NeMo-RL)"]
    assert row["mean_shift"] == pytest.approx(shift, rel=1e-12) and row["count"] == 3


def test_negative_k1_within_noise_is_explained():
    lp = torch.tensor([[-1.0, -1.0, -1.0, -1.0]], dtype=torch.float64).repeat(4, 1)
    ref = lp + torch.tensor([0.02, -0.01, 0.015, -0.005], dtype=torch.float64)
    d = dg.diagnose(dg.rollouts_from_tensors(lp, ref, torch.ones(4, 4)))
    assert d.estimates["k1"]["token_mean"] < 0
    assert any("k1 mean is negative" in t for t, _ in d.trouble)


def test_identical_policies():
    lp = -torch.rand(3, 4, dtype=torch.float64)
    d = dg.diagnose(dg.rollouts_from_tensors(lp, lp.clone(), torch.ones(3, 4)))
    assert d.estimates["k3"]["token_mean"] == 0
    assert any("identical" in t for t, _ in d.trouble)


def test_renamed_keys(tmp_path, capsys):
    b = _batch(seed=2)
    path = tmp_path / "verl.pt"
    torch.save({"batch": {"old_log_probs": b["logprob"], "ref_log_prob": b["ref_logprob"],
                          "response_mask": b["response_mask"]}}, path)
    code, out, err = run_cli(["diagnose", str(path), "--logprob-key", "batch.old_log_probs",
                              "--ref-key", "batch.ref_log_prob", "--mask-key", "batch.response_mask"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["diagnose", str(path)], capsys)
    assert_one_line_error(code, err)
    assert "missing key 'logprob'" in err and "--logprob-key" in err


def test_old_key_named_but_missing(good, capsys):
    path, _ = good
    code, _out, err = run_cli(["diagnose", str(path), "--old-key", "rollout_log_probs"], capsys)
    assert_one_line_error(code, err)
    assert "rollout_log_probs" in err


def test_plot_written(good, tmp_path, capsys):
    path, _ = good
    png = tmp_path / "report.png"
    code, out, err = run_cli(["diagnose", str(path), "--plot", str(png)], capsys)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_version_and_help(capsys):
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"klviz {klviz.__version__}"
    code, out, _ = run_cli([], capsys)
    assert code == 0 and "diagnose" in out


# -- bad files: one line, exit 2, nothing executed ---------------------------------------------

class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name,protocol", [("evil.pt", 2), ("evil.pth", pickle.HIGHEST_PROTOCOL), ("evil.npz", 2)])
def test_code_executing_pickle_is_refused(tmp_path, capsys, name, protocol):
    marker = tmp_path / "EXECUTED"
    path = tmp_path / name
    with open(path, "wb") as f:
        pickle.dump({"logprob": _Evil(marker), "ref_logprob": 0, "response_mask": 0}, f, protocol=protocol)
    code, out, err = run_cli(["diagnose", str(path)], capsys)
    assert_one_line_error(code, err)
    assert "refused" in err and "nothing in it was executed" in err
    assert not marker.exists()


def test_code_executing_pickle_inside_torch_zip_is_refused(tmp_path, capsys):
    """A real torch.save archive whose data.pkl was replaced by a pickle that calls os.system."""
    marker = tmp_path / "EXECUTED"
    good = tmp_path / "good.pt"
    torch.save({"logprob": torch.zeros(2, 2)}, good)
    bad = tmp_path / "trojan.pt"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("data.pkl"):
                data = pickle.dumps({"logprob": _Evil(marker)}, protocol=2)
            zout.writestr(item, data)
    code, _out, err = run_cli(["diagnose", str(bad)], capsys)
    assert_one_line_error(code, err)
    assert "refused" in err
    assert not marker.exists()


def test_console_script_refuses_pickle_without_traceback(tmp_path):
    marker = tmp_path / "EXECUTED"
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump(_Evil(marker), f, protocol=2)
    proc = subprocess.run([sys.executable, "-m", "klviz.cli", "diagnose", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "posix.system" in proc.stderr or "nt.system" in proc.stderr
    assert not marker.exists()


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_missing_key(tmp_path, capsys):
    b = _batch()
    p = _npz(tmp_path / "m.npz", logprob=b["logprob"].numpy(), response_mask=b["response_mask"].numpy())
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "missing key 'ref_logprob'" in err and "--ref-key" in err


def test_shape_mismatch(tmp_path, capsys):
    b = _batch()
    p = _npz(tmp_path / "s.npz", logprob=b["logprob"].numpy(), ref_logprob=b["ref_logprob"][:, :7].numpy(),
             response_mask=b["response_mask"].numpy())
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "(24, 7)" in err and "(24, 30)" in err


def test_not_two_dimensional(tmp_path, capsys):
    p = _npz(tmp_path / "d.npz", logprob=-np.ones(5), ref_logprob=-np.ones(5), response_mask=np.ones(5))
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "(5,)" in err and "[batch, tokens]" in err


def test_wrong_dtypes(tmp_path, capsys):
    b = _batch()
    p = _npz(tmp_path / "i.npz", logprob=b["logprob"].numpy().astype(np.int64),
             ref_logprob=b["ref_logprob"].numpy(), response_mask=b["response_mask"].numpy())
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "'logprob' has dtype int64" in err
    p = _npz(tmp_path / "s.npz", logprob=np.array([["a", "b"]]), ref_logprob=np.zeros((1, 2)),
             response_mask=np.ones((1, 2)))
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "'logprob'" in err and "expected numbers" in err


def test_object_array_in_npz_refused(tmp_path, capsys):
    p = tmp_path / "o.npz"
    np.savez(p, logprob=np.array([[{"a": 1}]], dtype=object), ref_logprob=np.zeros((1, 1)),
             response_mask=np.ones((1, 1)))
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "refused" in err


def test_bad_mask(tmp_path, capsys):
    b = _batch()
    m = b["response_mask"].numpy().astype(np.float32) * 0.5
    p = _npz(tmp_path / "m.npz", logprob=b["logprob"].numpy(), ref_logprob=b["ref_logprob"].numpy(), response_mask=m)
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "only 0 and 1" in err
    p = _npz(tmp_path / "z.npz", logprob=b["logprob"].numpy(), ref_logprob=b["ref_logprob"].numpy(),
             response_mask=np.zeros((24, 30)))
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "selects no token" in err


def test_nan_and_inf_are_reported(tmp_path, capsys):
    b = _batch()
    lp = b["logprob"].numpy().copy()
    ref = b["ref_logprob"].numpy().copy()
    lp[0, 0] = np.nan
    ref[1, 1] = -np.inf
    lp[0, 29] = np.nan      # beyond the mask of row 0? only counts if masked in
    p = _npz(tmp_path / "n.npz", logprob=lp, ref_logprob=ref, response_mask=b["response_mask"].numpy())
    code, out, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "NaN or inf" in err
    n_expected = 2 + int(b["response_mask"][0, 29])
    assert f"{n_expected} counted token(s)" in err
    assert "NaN or inf log-probs at counted tokens" in out      # the report still comes, with the sign
    d = dg.diagnose(dg.load_rollouts(p))
    assert all(math.isfinite(v) for e in d.estimates.values() for v in e.values())


def test_nan_only_in_padding_is_fine(tmp_path, capsys):
    b = _batch()
    lp = b["logprob"].numpy().copy()
    mask = b["response_mask"].numpy()
    lp[mask == 0] = np.nan
    p = _npz(tmp_path / "pad.npz", logprob=lp, ref_logprob=b["ref_logprob"].numpy(), response_mask=mask)
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert code == 0, err


@pytest.mark.parametrize("name,content,expect", [
    ("x.txt", b"logprob,ref\n", "not a recognised"),
    ("x.pkl", b"\x80\x04K\x01.", "not a recognised"),
    ("x.npz", b"hello world", "no zip signature"),
    ("x.pt", b"hello world", "not a torch.save file"),
    ("p0.pt", b"cposix\nsystem\n(S'touch /tmp/klviz_never'\ntR.", "nothing in it was executed"),
    ("x.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json", "not a readable .safetensors"),
    ("e.npz", b"", "is empty"),
])
def test_unrecognised_or_corrupt_files(tmp_path, capsys, name, content, expect):
    p = tmp_path / name
    p.write_bytes(content)
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert expect in err


def test_missing_file_and_directory(tmp_path, capsys):
    code, _, err = run_cli(["diagnose", str(tmp_path / "nope.npz")], capsys)
    assert_one_line_error(code, err)
    assert "no such file" in err
    code, _, err = run_cli(["diagnose", str(tmp_path)], capsys)
    assert_one_line_error(code, err)
    assert "directory" in err


def test_torch_file_that_is_not_a_dict(tmp_path, capsys):
    p = tmp_path / "t.pt"
    torch.save(torch.zeros(3, 3), p)
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "expected a dict" in err


def test_safetensors_is_optional(tmp_path, monkeypatch):
    b = _batch()
    p = dg.save_rollouts(tmp_path / "r.safetensors", b["logprob"], b["ref_logprob"], b["response_mask"])
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(dg.RolloutFileError, match="needs the 'safetensors' package"):
        dg.load_rollouts(p)


def test_save_rollouts_rejects_bad_suffix(tmp_path):
    b = _batch()
    with pytest.raises(ValueError, match="path must end"):
        dg.save_rollouts(tmp_path / "r.csv", b["logprob"], b["ref_logprob"], b["response_mask"])


def test_float16_and_bfloat16_dumps_are_read(tmp_path, capsys):
    b = _batch()
    p = tmp_path / "h.pt"
    torch.save({"logprob": b["logprob"].to(torch.bfloat16), "ref_logprob": b["ref_logprob"].half(),
                "response_mask": b["response_mask"].bool()}, p)
    code, out, err = run_cli(["diagnose", str(p)], capsys)
    assert code == 0, err
    assert "bfloat16" in out and "float16" in out


# -- the shipped sample ------------------------------------------------------------------------

def test_sample_dump_is_shipped_and_diagnosed(capsys):
    path = dg.sample_rollouts_path()
    assert path.exists(), "klviz/data/sample_rollouts.npz is missing (scripts/make_sample_rollouts.py makes it)"
    assert path.stat().st_size < 500_000
    code, out, err = run_cli(["diagnose"], capsys)
    assert code == 0, err
    assert "sample_rollouts.npz" in out
    d = dg.diagnose(dg.load_rollouts(path))
    assert d.n_tokens > 1000
