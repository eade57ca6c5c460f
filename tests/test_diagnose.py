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
    exact = (lpol.exp() * (lpol - lref)).sum(-1)  # KL(pi || ref) per position
    return {
        "logprob": lpol.gather(-1, x)[..., 0].float(),
        "ref_logprob": lref.gather(-1, x)[..., 0].float(),
        "response_mask": mask,
        "old_logprob": lold.gather(-1, x)[..., 0].float(),
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
    assert not any("not 1" in t.message for t in d.trouble)


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
    assert any("sampled by π_old" in t.message for t in d.trouble)


def test_old_equal_to_policy_is_on_policy(good):
    path, b = good
    r = dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"], b["logprob"])
    assert not dg.diagnose(r).off_policy


def test_sampling_mismatch_is_flagged():
    # tokens drawn at temperature 0.3 but scored at temperature 1: E[r] != 1 and k1 != k3
    b = _batch(seed=7, B=256, T=30, sampler_temp=0.3, spread=1.0)
    d = dg.diagnose(dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"]))
    assert any("mean ratio" in t.message for t in d.trouble)


def test_clamp_fractions_and_large_tokens():
    lp = torch.full((2, 5), -1.0, dtype=torch.float64)
    ref = lp.clone()
    ref[0, 0] = -1.0 + 12.0  # log r = +12: k1 = -12 (OpenRLHF clamps), k3 = e^12 - 13 (> 10)
    ref[0, 1] = -1.0 - 25.0  # log r = -25: verl's input clamp acts; k3 = 24 + e^-25 > 10
    ref[1, 0] = -1.0 + 5.0  # log r = 5: k3 = e^5 - 6 ≈ 142 > 10, k1 = -5 not clamped
    mask = torch.ones(2, 5, dtype=torch.bool)
    d = dg.diagnose(dg.rollouts_from_tensors(lp, ref, mask))
    frac = {label: v["count"] for label, v in d.clamps.items()}
    assert frac["verl low_var_kl: log r clamped to ±20 (also NeMo-RL)"] == 1
    assert frac["verl low_var_kl: k3 clamped to ≤ 10 (also NeMo-RL)"] == 3
    assert frac["OpenRLHF: k1 clamped to ±10"] == 2
    assert frac["OpenRLHF: k2 clamped to ≤ 10"] == 3  # ½·25 = 12.5 > 10 too
    assert frac["OpenRLHF: k3 clamped to ≤ 10"] == 3
    assert frac["open-instruct: log r clamped to ±40"] == 0
    # NeMo-RL clamps k1 and k2 too; its ±20 input clamp cannot act once the ±10 output clamp has
    for k in ("k1 clamped to ±10", "k2 clamped to ≤ 10"):
        for field in ("count", "fraction", "mean_shift"):
            assert d.clamps[f"NeMo-RL: {k}"][field] == d.clamps[f"OpenRLHF: {k}"][field]
    assert d.n_large == 2
    assert {(i, j) for i, j, _ in d.large_tokens[:2]} == {(0, 0), (0, 1)}
    # verl's low_var_kl (both clamps) vs raw k3: each clamped token contributes (10 - k3) / 10 tokens
    k3 = lambda x: math.expm1(x) - x  # noqa: E731
    expected = ((10 - k3(12)) + (10 - k3(-25)) + (10 - k3(5))) / 10
    assert d.clamps["verl low_var_kl: k3 clamped to ≤ 10 (also NeMo-RL)"]["mean_shift"] == pytest.approx(
        expected, rel=1e-9
    )
    assert any("|log r| > 10" in t.message for t in d.trouble)


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
    assert any("k1 mean is negative" in t.message for t in d.trouble)


def test_identical_policies():
    lp = -torch.rand(3, 4, dtype=torch.float64)
    d = dg.diagnose(dg.rollouts_from_tensors(lp, lp.clone(), torch.ones(3, 4)))
    assert d.estimates["k3"]["token_mean"] == 0
    assert any("identical" in t.message for t in d.trouble)


def test_renamed_keys(tmp_path, capsys):
    b = _batch(seed=2)
    path = tmp_path / "verl.pt"
    torch.save(
        {
            "batch": {
                "old_log_probs": b["logprob"],
                "ref_log_prob": b["ref_logprob"],
                "response_mask": b["response_mask"],
            }
        },
        path,
    )
    code, out, err = run_cli(
        [
            "diagnose",
            str(path),
            "--logprob-key",
            "batch.old_log_probs",
            "--ref-key",
            "batch.ref_log_prob",
            "--mask-key",
            "batch.response_mask",
        ],
        capsys,
    )
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
    proc = subprocess.run(
        [sys.executable, "-m", "klviz.cli", "diagnose", str(path)], capture_output=True, text=True, timeout=120
    )
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
    p = _npz(
        tmp_path / "s.npz",
        logprob=b["logprob"].numpy(),
        ref_logprob=b["ref_logprob"][:, :7].numpy(),
        response_mask=b["response_mask"].numpy(),
    )
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
    p = _npz(
        tmp_path / "i.npz",
        logprob=b["logprob"].numpy().astype(np.int64),
        ref_logprob=b["ref_logprob"].numpy(),
        response_mask=b["response_mask"].numpy(),
    )
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "'logprob' has dtype int64" in err
    p = _npz(
        tmp_path / "s.npz", logprob=np.array([["a", "b"]]), ref_logprob=np.zeros((1, 2)), response_mask=np.ones((1, 2))
    )
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "'logprob'" in err and "expected numbers" in err


def test_object_array_in_npz_refused(tmp_path, capsys):
    p = tmp_path / "o.npz"
    np.savez(
        p, logprob=np.array([[{"a": 1}]], dtype=object), ref_logprob=np.zeros((1, 1)), response_mask=np.ones((1, 1))
    )
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
    p = _npz(
        tmp_path / "z.npz",
        logprob=b["logprob"].numpy(),
        ref_logprob=b["ref_logprob"].numpy(),
        response_mask=np.zeros((24, 30)),
    )
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "selects no token" in err


def test_nan_and_inf_are_reported(tmp_path, capsys):
    b = _batch()
    lp = b["logprob"].numpy().copy()
    ref = b["ref_logprob"].numpy().copy()
    lp[0, 0] = np.nan
    ref[1, 1] = -np.inf
    lp[0, 29] = np.nan  # beyond the mask of row 0? only counts if masked in
    p = _npz(tmp_path / "n.npz", logprob=lp, ref_logprob=ref, response_mask=b["response_mask"].numpy())
    code, out, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "NaN or inf" in err
    n_expected = 2 + int(b["response_mask"][0, 29])
    assert f"{n_expected} counted token(s)" in err
    assert "NaN or inf log-probs at counted tokens" in out  # the report still comes, with the sign
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


@pytest.mark.parametrize(
    "name,content,expect",
    [
        ("x.txt", b"logprob,ref\n", "not a recognised"),
        ("x.pkl", b"\x80\x04K\x01.", "not a recognised"),
        ("x.npz", b"hello world", "no zip signature"),
        ("x.pt", b"hello world", "not a torch.save file"),
        ("p0.pt", b"cposix\nsystem\n(S'touch /tmp/klviz_never'\ntR.", "nothing in it was executed"),
        ("x.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json", "not a readable .safetensors"),
        ("e.npz", b"", "is empty"),
    ],
)
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
    code, _, err = run_cli(["diagnose", str(tmp_path)], capsys)  # a folder is a run: here an empty one
    assert_one_line_error(code, err)
    assert "directory" in err and "holds no dump" in err


def test_torch_file_that_is_not_a_dict(tmp_path, capsys):
    p = tmp_path / "t.pt"
    torch.save(torch.zeros(3, 3), p)
    code, _, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "expected a dict" in err


def test_safetensors_needs_no_package(tmp_path, monkeypatch):
    b = _batch()
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    p = dg.save_rollouts(tmp_path / "r.safetensors", b["logprob"], b["ref_logprob"], b["response_mask"])
    r = dg.load_rollouts(p)
    assert torch.equal(r.logprob.float(), b["logprob"])


def test_save_rollouts_rejects_bad_suffix(tmp_path):
    b = _batch()
    with pytest.raises(ValueError, match="path must end"):
        dg.save_rollouts(tmp_path / "r.csv", b["logprob"], b["ref_logprob"], b["response_mask"])


def test_float16_and_bfloat16_dumps_are_read(tmp_path, capsys):
    b = _batch()
    p = tmp_path / "h.pt"
    torch.save(
        {
            "logprob": b["logprob"].to(torch.bfloat16),
            "ref_logprob": b["ref_logprob"].half(),
            "response_mask": b["response_mask"].bool(),
        },
        p,
    )
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


# -- hostile files: refused from their headers, with memory measured -----------------------------


def _peak_rss_of_cli(path, *extra):
    """Exit status, stderr and peak resident MiB of ``klviz diagnose PATH`` in a fresh process."""
    # VmHWM is this process's own peak; ru_maxrss on Linux also keeps the peak of the parent it was forked from
    # (kept across execve), so a test session that grew big would show as this child's memory
    code = (
        "import sys\nfrom klviz.cli import main\nrc = main(['diagnose', *sys.argv[1:]])\n"
        "kib = next(int(ln.split()[1]) for ln in open('/proc/self/status') if ln.startswith('VmHWM:'))\n"
        "print('PEAK', kib // 1024, file=sys.stderr)\nsys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path), *extra], capture_output=True, text=True, timeout=240)
    lines = done.stderr.strip().splitlines()
    peak = int(lines[-1].split()[1])
    return done.returncode, "\n".join(lines[:-1]), peak


def _npy_bytes(shape, descr="<f8"):
    import struct

    hdr = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple(shape)}, }}"
    hdr += " " * (-(len(hdr) + 11) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode()


def test_zip_bomb_refused_before_allocating(tmp_path):
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("logprob.npy", "w", force_zip64=True) as f:
            f.write(_npy_bytes((40000, 40000)))
            for _ in range(200):
                f.write(b"\0" * (1 << 20))
    rc, err, peak = _peak_rss_of_cli(path)
    assert rc == 2 and "beyond the cap" in err and "--max-tokens" in err
    assert peak < 600, peak


def test_forged_npz_header_refused(tmp_path):
    path = tmp_path / "forged.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("logprob.npy", _npy_bytes((1000, 1000)) + b"\0" * 64)
    with pytest.raises(dg.RolloutFileError, match="corrupt or forged"):
        dg.open_dump(path)


@pytest.mark.parametrize("shape,stride", [((4096, 4096), (0, 0)), ((8, 8), (1, 1)), ((50000, 50000), (0, 0))])
def test_strided_tensors_refused(tmp_path, shape, stride):
    base = torch.zeros(64)
    t = base.as_strided(shape, stride)
    path = tmp_path / "strided.pt"
    torch.save({"logprob": t, "ref_logprob": t, "response_mask": t}, path)
    assert path.stat().st_size < 4000
    rc, err, peak = _peak_rss_of_cli(path)
    assert rc == 2 and "Traceback" not in err
    assert any(s in err for s in ("stride-0", "overlapping", "beyond the cap"))
    assert peak < 600, peak


def test_sparse_and_meta_tensors_refused(tmp_path):
    for name, t in (("sparse", torch.zeros(2, 3).to_sparse()), ("meta", torch.empty(2, 3, device="meta"))):
        p = tmp_path / f"{name}.pt"
        torch.save({"logprob": t, "ref_logprob": torch.zeros(2, 3), "response_mask": torch.ones(2, 3)}, p)
        with pytest.raises(dg.RolloutFileError, match=name):
            dg.open_dump(p)


def test_non_contiguous_views_are_read_correctly(tmp_path):
    b = _batch(seed=4)
    wide = torch.zeros(24, 45)
    wide[:, 15:] = b["logprob"]
    p = tmp_path / "view.pt"
    torch.save(
        {
            "logprob": wide[:, 15:],
            "ref_logprob": b["ref_logprob"].t().contiguous().t(),
            "response_mask": b["response_mask"],
        },
        p,
    )
    r = dg.load_rollouts(p)
    assert torch.equal(r.logprob.float(), b["logprob"]) and torch.equal(r.ref_logprob.float(), b["ref_logprob"])


def test_big_endian_arrays(tmp_path, capsys):
    b = _batch(seed=6)
    p = tmp_path / "be.npz"
    np.savez(
        p,
        logprob=b["logprob"].numpy().astype(">f8"),
        ref_logprob=b["ref_logprob"].numpy().astype(">f4"),
        response_mask=b["response_mask"].numpy().astype(">i4"),
    )
    d = dg.diagnose(p)
    ref = dg.diagnose(dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"]))
    assert d.estimates["k3"]["token_mean"] == pytest.approx(ref.estimates["k3"]["token_mean"], rel=1e-6)
    code, _out, err = run_cli(["diagnose", str(p)], capsys)
    assert code == 0, err


def test_control_characters_in_key_names_are_escaped(tmp_path, capsys):
    p = tmp_path / "esc.npz"
    np.savez(p, **{"\x1b[2J\x1b[31mred\x07": np.zeros((2, 2)), "x" * 5000: np.zeros((2, 2))})
    code, _out, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "\x1b" not in err and "\x07" not in err and "\\x1b" in err
    assert len(err) < 600


def test_allocation_failure_is_one_line(tmp_path, capsys, monkeypatch):
    b = _batch()
    p = dg.save_rollouts(tmp_path / "ok.npz", b["logprob"], b["ref_logprob"], b["response_mask"])

    def boom(*_a, **_k):
        raise MemoryError

    monkeypatch.setattr(dg, "diagnose", boom)
    code, _out, err = run_cli(["diagnose", str(p)], capsys)
    assert_one_line_error(code, err)
    assert "memory" in err


def test_max_tokens_cap(good, capsys):
    path, _ = good
    code, _out, err = run_cli(["diagnose", str(path), "--max-tokens", "100"], capsys)
    assert_one_line_error(code, err)
    assert "beyond the cap of 100" in err


# -- streaming equals the whole-tensor computation ----------------------------------------------


def test_streaming_chunks_give_the_same_numbers():
    b = _batch(seed=8, B=40, old_shift=0.3)
    r = dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"], b["old_logprob"])
    whole, chunked = dg.diagnose(r), dg.diagnose(r, chunk_tokens=31)
    for k in ("k1", "k2", "k3"):
        for f in ("token_mean", "token_mean_se", "seq_sum_mean", "seq_token_mean", "token_std"):
            assert chunked.estimates[k][f] == pytest.approx(whole.estimates[k][f], rel=1e-10)
    m, se = klviz.statistics.clustered_mean_se(
        klviz.kernel.k3(b["ref_logprob"].double() - b["logprob"].double()), b["response_mask"].bool()
    )
    assert whole.estimates["k3"]["token_mean"] == pytest.approx(m) and whole.estimates["k3"][
        "token_mean_se"
    ] == pytest.approx(se)
    for label in whole.clamps:
        assert chunked.clamps[label]["count"] == whole.clamps[label]["count"]


# -- what an engineer looks for -------------------------------------------------------------------


def _codes(d):
    return {t.code: t.severity for t in d.trouble}


def _shifted(b, direction):
    m = b["response_mask"]
    lp, ref = b["logprob"].clone(), b["ref_logprob"].clone()
    lp[m == 0] = 0.0
    ref[m == 0] = 0.0
    shifted = torch.zeros_like(m)
    if direction == "right":
        shifted[:, 1:] = m[:, :-1]
    else:
        shifted[:, :-1] = m[:, 1:]
    return lp, ref, shifted


@pytest.mark.parametrize("direction", ["right", "left"])
def test_shifted_mask_is_flagged(direction):
    b = _batch(seed=9, B=32, T=40)
    b["response_mask"][:, 0] = 1
    lp, ref, m = _shifted(b, direction)
    d = dg.diagnose(dg.rollouts_from_tensors(lp, ref, m))
    assert _codes(d).get("mask_shifted") == "error"
    clean = dg.diagnose(dg.rollouts_from_tensors(lp, ref, b["response_mask"]))
    assert "mask_shifted" not in _codes(clean)
    assert d.positions["start"]["count"][0] > 0 and len(d.positions["end"]["k3"]) > 0


def test_bf16_storage_is_flagged_with_its_bias(tmp_path):
    b = _batch(seed=10, B=64, spread=0.05)
    for name, lp, ref in (
        ("stored", b["logprob"].bfloat16(), b["ref_logprob"].bfloat16()),
        ("rounded", b["logprob"].bfloat16().float(), b["ref_logprob"].bfloat16().float()),
    ):
        p = tmp_path / f"{name}.pt"
        torch.save({"logprob": lp, "ref_logprob": ref, "response_mask": b["response_mask"]}, p)
        d = dg.diagnose(p)
        assert _codes(d).get("low_precision") == "warning", name
        assert d.precision["logprob"]["rounded_to"] == "bfloat16"
        assert d.precision["k3_bias_from_rounding"] > 0
    d = dg.diagnose(dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"]))
    assert "low_precision" not in _codes(d)


def test_trl_invalid_logprob_padding_is_named():
    b = _batch(seed=11)
    m = b["response_mask"].bool()
    lp, ref = b["logprob"].masked_fill(~m, 1.0), b["ref_logprob"].masked_fill(~m, 1.0)
    d = dg.diagnose(dg.rollouts_from_tensors(lp, ref, m))
    assert _codes(d).get("trl_padding") == "info" and "positive_logprobs" not in _codes(d)
    d = dg.diagnose(dg.rollouts_from_tensors(lp, ref, torch.ones_like(m)))  # the mask counts the padding
    assert _codes(d).get("trl_padding_counted") == "error" and "positive_logprobs" not in _codes(d)
    assert any("INVALID_LOGPROB" in t.message for t in d.trouble)


def test_heavy_tail_needs_a_sample():
    lp = torch.tensor([[-5.0]], dtype=torch.float64)
    d = dg.diagnose(dg.rollouts_from_tensors(lp, lp + 3.0, torch.ones(1, 1)))
    assert "heavy_tail" not in _codes(d)


def test_input_clamp_row_cannot_move_the_forward_value():
    lp = torch.full((2, 3), -1.0, dtype=torch.float64)
    ref = lp + torch.tensor([[25.0, -30.0, 0.1], [0.2, -0.1, 45.0]], dtype=torch.float64)
    d = dg.diagnose(dg.rollouts_from_tensors(lp, ref, torch.ones(2, 3)))
    row = d.clamps["verl low_var_kl: log r clamped to ±20 (also NeMo-RL)"]
    assert row["count"] == 3 and row["mean_shift"] == 0.0 and row["value_can_change"] is False
    oi = d.clamps["open-instruct: log r clamped to ±40"]
    assert oi["value_can_change"] and oi["count"] == 1 and oi["mean_shift"] < 0
    assert "cannot change" in dg.format_report(d)


def test_off_policy_agreement_uses_rho_weighted_rows():
    b = _batch(seed=12, B=96, old_shift=0.5)
    d = dg.diagnose(dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"], b["old_logprob"]))
    a = d.agreement
    assert "ρ-weighted" in a["rows"]
    assert a["k3"] == d.extra["ρ·k3, ρ = π/π_old"]["token_mean"]
    assert abs(a["k1_minus_k3"]) < 4 * a["k1_minus_k3_se"]
    assert "ρ-weighted rows" in dg.format_report(d)


def test_temperature_mismatch_and_clean_control_through_json(tmp_path, capsys):
    import json

    hot = _batch(seed=13, B=128, sampler_temp=0.5, spread=1.0)
    clean = _batch(seed=13, B=128, spread=1.0)
    out = {}
    for name, b in (("hot", hot), ("clean", clean)):
        p = dg.save_rollouts(tmp_path / f"{name}.npz", b["logprob"], b["ref_logprob"], b["response_mask"])
        code, text, err = run_cli(["diagnose", str(p), "--json"], capsys)
        out[name] = json.loads(text)
        assert out[name]["schema"] == dg.SCHEMA and out[name]["schema_version"] == dg.SCHEMA_VERSION
    codes = {t["code"] for t in out["hot"]["trouble"]}
    assert codes & {"mean_ratio", "k1_negative"}
    assert not {t["code"] for t in out["clean"]["trouble"] if t["severity"] != "info"} - {"heavy_tail"}
    for t in out["hot"]["trouble"]:
        assert set(t) >= {"code", "severity", "message"} and t["severity"] in dg.SEVERITIES
    est = out["clean"]["estimates"]
    k3 = next(e for e in est if e["name"] == "k3" and e["aggregation"] == "token-mean")
    assert k3["se"] > 0 and k3["estimates"] == "KL(π ‖ π_ref)" and k3["unbiased"]


def test_fail_on(tmp_path, capsys):
    b = _batch(seed=14)
    m = b["response_mask"].bool()
    p = dg.save_rollouts(
        tmp_path / "pad.npz",
        b["logprob"].masked_fill(~m, 1.0),
        b["ref_logprob"].masked_fill(~m, 1.0),
        torch.ones_like(m),
    )
    assert cli.main(["diagnose", str(p), "--fail-on", "error"]) == 1
    good = dg.save_rollouts(tmp_path / "ok.npz", b["logprob"], b["ref_logprob"], b["response_mask"])
    assert cli.main(["diagnose", str(good), "--fail-on", "error", "--json"]) == 0
    capsys.readouterr()


def test_logged_values_are_matched(tmp_path, capsys):
    import json

    from klviz import frameworks as fw

    b = _batch(seed=15, B=64, old_shift=0.3)
    lp, ref, m, old = b["logprob"], b["ref_logprob"], b["response_mask"], b["old_logprob"]
    p = dg.save_rollouts(tmp_path / "run.pt", lp, ref, m, old)
    kl_loss = float(fw.verl_kl_loss(lp, ref, m)["kl_loss"])
    ppo_kl = float(fw.verl_ppo_kl(lp, old, m)["ppo_kl"])
    in_reward = float(fw.verl_kl_in_reward(old, ref, m)["logged"])
    trl_kl = float(fw.trl_ppo_kl(old, ref, m)["logged"])
    d = dg.diagnose(p)
    se = d.estimates["k3"]["token_mean_se"]
    code, text, err = run_cli(
        [
            "diagnose",
            str(p),
            "--json",
            "--logged",
            f"actor/kl_loss={kl_loss}",
            "--logged",
            f"actor/ppo_kl={ppo_kl}",
            "--logged",
            f"actor/reward_kl_penalty={in_reward}",
            "--logged",
            f"objective/kl={trl_kl}",
            "--logged",
            f"actor/kl_loss={kl_loss + 20 * se}",
        ],
        capsys,
    )
    assert code == 0, err
    items = json.loads(text)["logged"]
    assert [i["consistent"] for i in items] == [True, True, True, True, False]
    assert "ppo_kl" in items[1]["matches"][0] and items[1]["estimates"] == "KL(π_old ‖ π)"
    assert items[2]["estimates"].startswith("KL(π_old ‖ π_ref)")
    for i in items:
        assert {"name", "value", "consistent", "matches"} <= set(i)
    code, _out, err = run_cli(["diagnose", str(p), "--logged", "kl"], capsys)
    assert_one_line_error(code, err)


def test_tokens_and_token_ids_with_vocab(tmp_path):
    b = _batch(seed=16)
    ids = torch.randint(0, 5, b["logprob"].shape, generator=torch.Generator().manual_seed(0))
    vocab = tmp_path / "vocab.json"
    vocab.write_text('["a", "b", "<eos>", "d", "\\u001b[31m"]')
    p = dg.save_rollouts(tmp_path / "ids.npz", b["logprob"], b["ref_logprob"], b["response_mask"], token_ids=ids)
    with dg.open_dump(p) as f:
        d = dg.diagnose(f, vocab=dg.read_vocab(vocab))
    tr = d.token_report
    assert tr["distinct"] == 5 and len(tr["k3"]) == 5
    assert sum(x["count"] for x in tr["k3"]) == d.n_tokens
    assert all("\x1b" not in x["token"] for x in tr["k3"])
    strings = np.array([[f"t{j % 3}" for j in range(30)] for _ in range(24)])
    p2 = tmp_path / "tok.npz"
    np.savez(
        p2,
        logprob=b["logprob"].numpy(),
        ref_logprob=b["ref_logprob"].numpy(),
        response_mask=b["response_mask"].numpy(),
        tokens=strings,
    )
    assert dg.diagnose(p2).token_report["distinct"] == 3


def test_ratio_histogram_and_clip_fraction():
    b = _batch(seed=17, old_shift=0.5)
    d = dg.diagnose(
        dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"], b["old_logprob"]), clip=0.2
    )
    rho = torch.exp(b["logprob"].double() - b["old_logprob"].double())[b["response_mask"].bool()]
    assert d.ratio["clip_fraction"] == pytest.approx(float(((rho - 1).abs() > 0.2).double().mean()))
    assert sum(d.ratio["log_rho_hist"]) == d.n_tokens


def test_engine_mismatch_section_equals_mismatch_metrics():
    from klviz import mismatch

    b = _batch(seed=18, B=48)
    g = torch.Generator().manual_seed(1)
    ro = b["logprob"] + 0.05 * torch.randn(b["logprob"].shape, generator=g)
    d = dg.diagnose(dg.rollouts_from_tensors(b["logprob"], b["ref_logprob"], b["response_mask"], rollout_logprob=ro))
    ref = mismatch.mismatch_metrics(b["logprob"], ro, b["response_mask"].bool())
    for key in (
        "k1",
        "k2",
        "k3",
        "k1_se",
        "k3_se",
        "mean_ratio",
        "mean_ratio_se",
        "chi2_token",
        "chi2_seq",
        "ppl_ratio",
        "token_mult_prob_error",
        "seq_sum_k3",
        "seq_max_k3",
        "abs_diff_max",
    ):
        assert d.mismatch[key] == pytest.approx(ref[key], rel=1e-6, abs=1e-9), key
    assert "engine_mismatch" in _codes(d)
    assert "Engine–trainer mismatch" in dg.format_report(d)


def test_a_run_of_dumps(tmp_path, capsys):
    import json

    run = tmp_path / "run"
    run.mkdir()
    for step in (30, 10, 20):
        b = _batch(seed=step, spread=0.1 * step / 10)
        dg.save_rollouts(run / f"dump_{step}.npz", b["logprob"], b["ref_logprob"], b["response_mask"], step=step)
    code, out, err = run_cli(["diagnose", str(run), "--plot", str(tmp_path / "trend.png")], capsys)
    assert code == 0, err
    assert out.index("dump_10") < out.index("dump_20") < out.index("dump_30")
    assert (tmp_path / "trend.png").read_bytes()[:4] == b"\x89PNG"
    code, out, err = run_cli(["diagnose", str(run), "--json"], capsys)
    series = json.loads(out)["series"]
    assert [s["step"] for s in series] == [10, 20, 30]
    assert series[0]["report"]["trend"]["k3"]["value"] < series[2]["report"]["trend"]["k3"]["value"]


def test_format_guide_ships_with_the_package(capsys):
    assert dg.format_guide_path().is_file()
    code, out, _ = run_cli(["diagnose", "--format-guide"], capsys)
    assert code == 0 and "JSON report" in out and "rollout_logprob" in out
    done = subprocess.run([sys.executable, "-m", "klviz.cli", "diagnose", "--help"], capture_output=True, text=True)
    assert "rollout_format.md" in done.stdout


def test_the_shipped_mismatched_sample_reports_the_engine_and_its_kept_mass():
    """The second sample dump was sampled by a bf16, top-p 0.8 engine of the tiny LM and rescored by
    the float32 trainer: diagnose must find the mismatch, and the mean ratio must sit at the kept
    mass (below 1 by far more than its SE), as lesson 08 teaches."""
    import json as _json
    import subprocess
    import sys

    path = dg.sample_rollouts_path().with_name("sample_rollouts_mismatch.npz")
    out = subprocess.run(
        [sys.executable, "-m", "klviz.cli", "diagnose", str(path), "--json"], capture_output=True, text=True, check=True
    ).stdout
    report = _json.loads(out)
    codes = {t["code"] for t in report["trouble"]}
    assert {"engine_mismatch", "engine_support"} <= codes
    mm = report["sections"]["mismatch"]
    assert mm["mean_ratio"] < 1 - 10 * mm["mean_ratio_se"]
    assert 0.9 < mm["mean_ratio"] < 1.0
