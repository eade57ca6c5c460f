"""Log histories for ``klviz diagnose --logged HISTORY``: the formats read, and each logged step paired with the
dumps that made its value (windows when a framework logs every k steps, and the off-by-one of dumps labelled
before the update)."""

from __future__ import annotations

import json

import pytest
import torch

from klviz import cli
from klviz import diagnose as dg
from klviz import frameworks as fw


def _step_batch(step, g):
    lp = -torch.empty(8, 12).exponential_(1.0, generator=g) - 0.01
    ref = (lp + 0.3 * torch.randn(8, 12, generator=g)).clamp(max=-1e-3)
    m = (torch.arange(12)[None] < torch.randint(3, 13, (8,), generator=g)[:, None]).float()
    return lp, ref, m


def _run(tmp_path, steps=(1, 2, 3, 4), label_offset=0):
    """Dumps of several steps and the value TRL's default `kl` formula logs for each (one micro-batch)."""
    g = torch.Generator().manual_seed(0)
    values = {}
    for k in steps:
        lp, ref, m = _step_batch(k, g)
        dg.save_rollouts(tmp_path / f"kl_dump_step{k + label_offset}.pt", lp, ref, m, step=k + label_offset)
        values[k] = float(fw.trl_grpo_kl(lp, ref, m)["logged"])
    return values


@pytest.mark.parametrize("fmt", ["list", "trainer_state", "mapping", "jsonl", "csv"])
def test_history_formats(tmp_path, fmt):
    recs = [{"step": 1, "kl": 0.5, "loss": -1.0}, {"step": 2, "kl": 0.25, "note": "x"}]
    if fmt == "list":
        p = tmp_path / "h.json"
        p.write_text(json.dumps(recs))
    elif fmt == "trainer_state":
        p = tmp_path / "trainer_state.json"
        p.write_text(json.dumps({"global_step": 2, "log_history": recs}))
    elif fmt == "mapping":
        p = tmp_path / "h.json"
        p.write_text(json.dumps({"1": {"kl": 0.5, "loss": -1.0}, "2": {"kl": 0.25}}))
    elif fmt == "jsonl":
        p = tmp_path / "h.jsonl"
        p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    else:
        p = tmp_path / "h.csv"
        p.write_text("_step,train/kl,loss\n1,0.5,-1.0\n2,0.25,\n")
    h = dg.read_history(p)
    name = "train/kl" if fmt == "csv" else "kl"
    assert h[1.0][name] == 0.5 and h[2.0][name] == 0.25
    assert dg.history_names(h) == [name]


@pytest.mark.parametrize(
    "content, suffix, match",
    [
        ("{", ".json", "not a log history"),
        ('[{"kl": 1}]', ".json", "no record with a step"),
        ("\xff", ".csv", "not UTF-8"),
    ],
)
def test_bad_histories_are_refused(tmp_path, content, suffix, match):
    p = tmp_path / f"h{suffix}"
    p.write_bytes(content.encode("latin-1"))
    with pytest.raises(ValueError, match=match):
        dg.read_history(p)


def test_each_step_checked_and_a_wrong_one_found(tmp_path, capsys):
    values = _run(tmp_path)
    log = [{"step": k, "kl": v} for k, v in values.items()]
    log[2]["kl"] *= 3  # step 3 logged something else
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": log}))
    assert cli.main(["diagnose", str(tmp_path), "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)["logged"]
    verdicts = {s["step"]: s["logged"][0]["consistent"] for s in checked["steps"]}
    assert verdicts == {1: True, 2: True, 3: False, 4: True} and checked["offset"] == 0
    cli.main(["diagnose", str(tmp_path)])
    text = capsys.readouterr().out
    assert "@3: kl ≠ (" in text and "@2: kl =" in text


def test_dumps_one_step_early_are_detected(tmp_path, capsys):
    values = _run(tmp_path, label_offset=-1)
    hist = tmp_path / "log.jsonl"
    hist.write_text("\n".join(json.dumps({"step": k, "kl": v}) for k, v in values.items()))
    assert cli.main(["diagnose", str(tmp_path), "--json", "--logged", str(hist)]) == 0
    checked = json.loads(capsys.readouterr().out)["logged"]
    assert checked["offset"] == 1 and checked["offsets"]["0"] == 0 and checked["offsets"]["1"] == 4
    assert "off by +1" in checked["note"]


def test_a_window_of_steps_is_one_value_and_a_partial_window_is_not_checked(tmp_path, capsys):
    g = torch.Generator().manual_seed(1)
    per_step = {}
    for k in (1, 2, 3, 4):
        lp, ref, m = _step_batch(k, g)
        dg.save_rollouts(tmp_path / f"d{k}.pt", lp, ref, m, step=k)
        per_step[k] = float(fw.trl_grpo_kl(lp, ref, m)["logged"])
    # logging every 2 steps: the mean of the two steps' values (TRL averages its micro-batch values)
    log = [{"step": 2, "kl": (per_step[1] + per_step[2]) / 2}, {"step": 4, "kl": (per_step[3] + per_step[4]) / 2}]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": log}))
    assert cli.main(["diagnose", str(tmp_path), "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["logged"]["steps"]
    assert [s["logged"][0]["consistent"] for s in steps] == [True, True]
    (tmp_path / "d3.pt").unlink()
    assert cli.main(["diagnose", str(tmp_path), "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["logged"]["steps"]
    assert steps[1]["incomplete"] == [3.0] and steps[1]["logged"][0]["consistent"] is None
