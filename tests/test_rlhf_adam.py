"""klviz.rlhf.Adam gives the numbers torch.optim.Adam gives, bit for bit, without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import torch

from klviz import rlhf


def test_same_run_as_torch_adam():
    cfg = rlhf.LabConfig(steps=6, epochs=2, placement="k3 in loss")
    ours = rlhf.TrainingRun(cfg)
    ours.advance(6)
    theirs = rlhf.TrainingRun(cfg)
    theirs.optimizer = torch.optim.Adam(theirs.policy.parameters(), lr=cfg.lr)  # type: ignore[assignment]
    theirs.advance(6)
    for a, b in zip(ours.policy.state_dict().values(), theirs.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert ours.history.metrics == theirs.history.metrics


def test_training_does_not_import_dynamo():
    code = (
        "import sys, klviz.rlhf as r; r.TrainingRun(r.LabConfig(steps=1)).advance(1); "
        "print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
