"""The benchmark scripts keep working: each runs at a tiny size in a subprocess (not a timed test).

The figures themselves are not checked here (a tiny size measures overheads, and the machine is
shared); the scripts' own correctness checks are: the exact KL agrees with ``F.kl_div``, the
estimator statistics agree with the closed forms and ``klviz --help`` loads no torch, otherwise the
script exits with status 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ipywidgets as widgets
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def run_script(name: str, *args: str) -> str:
    env = dict(os.environ, MPLBACKEND="agg", PYTHONUNBUFFERED="1")
    done = subprocess.run(
        [sys.executable, str(BENCH / name), *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=240
    )
    assert done.returncode == 0, f"{name} {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_estimator_stats_script_tiny():
    out = run_script("estimator_stats.py", "--num-samples", "20000", "--repeat", "1", "--no-memory")
    for method in ("randn", "schulman", "klviz"):
        assert f"\n   {method}" in out
    assert "klviz / randn" in out and "klviz / schulman" in out
    for mu in ("1", "0.1"):  # both pairs, timed in the same rounds
        assert f"mu={mu}: klviz / randn" in out and f"\n   klviz mu={mu}" in out
    assert "of the closed forms (ok)" in out


def test_exact_kl_script_tiny():
    out = run_script("exact_kl.py", "--rows", "16", "--vocab", "300", "--repeat", "1", "--no-memory")
    assert "F.kl_div" in out and "klviz" in out
    assert "largest relative difference" in out and ": ok" in out.split("largest relative difference")[1]


def test_startup_script_tiny():
    out = run_script("startup.py", "--repeat", "1")
    for command in ("import numpy", "klviz --help", "klviz diagnose --help", "import klviz"):
        assert f"\n   {command}" in out
    assert "klviz --help / import numpy" in out
    assert "check: klviz --help loads none of torch, matplotlib, ipywidgets (ok)" in out


def test_panels_script_tiny():
    out = run_script("panels.py", "--only", "StartHerePanel", "--changes", "2")
    row = next(ln for ln in out.splitlines() if ln.split() and ln.split()[0] == "StartHerePanel")
    assert "FAILED" not in row and "ERRORS" not in row and "no controls" not in row
    assert "status shows it" in out


# -- the harness's own pieces, in process -------------------------------------------------------


def _benchmark_module(name: str):
    """Import ``benchmarks/<name>.py`` for the duration of a module's tests."""
    import importlib

    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def common():
    yield from _benchmark_module("common")


def test_missing_device_is_a_clear_error(common, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        common.parse_args(common.make_parser("x"), ["--device", "cuda"])
    assert exit_info.value.code == 2 and "--device" in capsys.readouterr().err
    assert str(common.parse_args(common.make_parser("x"), []).device) == "cpu"


def test_peak_memory_probe(common, capsys, tmp_path):
    import torch

    # in this process: a 64 MiB tensor must show up as at least that much extra resident memory
    common.child_peak_memory(lambda: torch.ones(16 * 2**20), torch.device("cpu"))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("PEAK_EXTRA_BYTES=") and int(line.split("=")[1]) >= 60 * 2**20
    # and the parent side reads the figure a child prints (a child without torch: fast)
    probe = tmp_path / "child.py"
    probe.write_text("print('noise'); print('PEAK_EXTRA_BYTES=1234')\n")
    assert common.peak_memory_in_child(str(probe), []) == 1234


@pytest.fixture(scope="module")
def panels_module():
    yield from _benchmark_module("panels")


def test_discovery_finds_the_start_here_panel(panels_module):
    found, problems = panels_module.discover_panels()
    names = {cls.__name__ for cls in found}
    assert "StartHerePanel" in names and "Panel" not in names
    assert all(isinstance(p, str) for p in problems)


def test_neighbour_values_stay_in_range(panels_module):
    nb = panels_module.neighbour_value
    assert nb(widgets.FloatSlider(value=1.0, min=0.0, max=1.0, step=0.1)) == pytest.approx(0.9)
    assert nb(widgets.IntSlider(value=3, min=0, max=10, step=2)) == 5
    assert nb(widgets.Checkbox(value=False)) is True
    assert nb(widgets.Dropdown(options=[("a", 1), ("b", 2)], value=2)) == 1
    assert nb(widgets.SelectionSlider(options=[10, 100, 1000], value=100)) == 1000
    assert nb(widgets.Dropdown(options=["only"], value="only")) is None
    assert nb(widgets.FloatLogSlider(value=10.0, base=10, min=-1, max=1, step=0.5)) == pytest.approx(10**0.5)


def test_percentile_and_ratio_helpers(common):
    assert common.p95([1.0] * 19 + [21.0]) == pytest.approx(2.0)
    assert common.p95([5.0]) == 5.0
    assert common.ratio_median([2.0, 4.0, 9.0], [1.0, 2.0, 3.0]) == 2.0


def test_estimator_stats_torch_path_matches_numpy_path():
    # the CUDA code path (torch kernels) run on the CPU gives the statistics of the NumPy path
    import torch
    from torch.distributions import Normal

    from klviz.devices import make_generator
    from klviz.montecarlo import _normal_stats

    q, p = Normal(0.2, 0.9), Normal(0.5, 1.3)
    cpu = torch.device("cpu")
    a = _normal_stats(q, p, 50_001, make_generator(4), cpu, 4096, use_numpy=True)
    b = _normal_stats(q, p, 50_001, make_generator(4), cpu, 4096, use_numpy=False)
    for k in ("k1", "k2", "k3"):
        assert a[k].n == b[k].n == 50_001
        assert a[k].mean == pytest.approx(b[k].mean, rel=1e-5, abs=1e-7)
        assert a[k].m2 == pytest.approx(b[k].m2, rel=1e-5)


def test_estimator_stats_variance_sound_when_mean_dwarfs_spread():
    # k1 for p = N(300, 1): mean -45,000 (as -log r: +45,000), spread 300; E[x²] - E[x]² would lose
    # about 4.5 of float32's 7 digits here, the shifted sums lose none
    import math

    from torch.distributions import Normal

    import klviz

    mu, n = 300.0, 200_000
    s = klviz.estimator_stats(Normal(0.0, 1.0), Normal(mu, 1.0), n, generator=klviz.make_generator(2))
    assert abs(s["k1"]["mean"] - mu * mu / 2) < 4 * mu / math.sqrt(n)
    assert s["k1"]["std"] == pytest.approx(mu, rel=4 / math.sqrt(2 * n))


def test_diagnose_script_tiny():
    out = run_script("diagnose.py", "--batch", "8", "--tokens", "64", "--repeat", "1")
    assert "plain torch" in out and "klviz diagnose" in out
    assert "klviz / plain torch: time" in out and "peak memory" in out
    assert "both ran" in out


def test_lab_verdicts_script_on_the_stored_check_seeds():
    out = run_script("lab_verdicts.py", "lab")
    assert "lesson seeds 0-15, check seeds 100-115" in out
    assert "18 of 18 verdicts hold on the lesson's seeds; of the 15 the lessons call firm, 15 hold" in out
    assert out.count("fragile (the lessons say so)") == 3
