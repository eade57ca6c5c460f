"""``klviz.integrations.trl`` against TRL's real ``GRPOTrainer`` (the release pip installs, in the test extra).

A tiny GPT-2 and a character tokenizer are built here (no download); TRL trains them on the CPU for a few
steps with β = 0.04 and two gradient-accumulation micro-batches per step, once with ``num_iterations=1`` and
once with 2 (reuse steps, where ρ = π/π_old ≠ 1). Then ``klviz diagnose RUN_DIR`` must find every logged ``kl``
exactly equal to TRL's default formula on the dumps of its step, and must refuse wrong values. Never skipped:
TRL is part of the test environment.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from klviz import cli
from klviz import diagnose as dg
from klviz.integrations.trl import LOG_FILE, attach

# TRL, transformers and datasets are imported by the tests that use them, not when pytest collects this file:
# every session would otherwise pay their import (about 10 s here) and carry their memory.

# transformers' own deprecation notices, raised from inside TRL's trainer (upstream; nothing here calls them)
pytestmark = pytest.mark.filterwarnings("ignore:`.*` is deprecated and will be removed in v6:FutureWarning")


def _tiny_model(folder: Path) -> tuple[Any, Any]:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    chars = list("abcdefgh ")
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    hf.padding_side = "left"
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=len(vocab),
        n_positions=64,
        n_embd=16,
        n_layer=1,
        n_head=2,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    hf.save_pretrained(folder)
    return GPT2LMHeadModel.from_pretrained(folder), hf  # TRL builds the reference from this folder


def _reward(completions, **_kw):
    return [float(c.count("a")) - 0.1 * len(c) for c in completions]


@pytest.fixture(scope="module", params=[1, 2], ids=["num_iterations=1", "num_iterations=2"])
def run(request, tmp_path_factory):
    import trl
    from datasets import Dataset

    tmp = tmp_path_factory.mktemp(f"trl{request.param}")
    model, tok = _tiny_model(tmp / "model")
    args = trl.GRPOConfig(
        output_dir=str(tmp / "out"),
        beta=0.04,
        num_generations=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_completion_length=8,
        max_steps=3,
        num_iterations=request.param,
        logging_steps=1,
        learning_rate=5e-2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    data = Dataset.from_dict({"prompt": ["abc", "bca", "cab", "hgf", "dde", "fea"] * 4})
    trainer = trl.GRPOTrainer(model=model, reward_funcs=_reward, args=args, train_dataset=data, processing_class=tok)
    recorder = attach(trainer, tmp / "dumps")
    trainer.train()
    return tmp / "dumps", recorder, request.param


def test_the_pinned_trl_is_the_one_read():
    import trl

    assert trl.__version__ == "1.16.0"


def test_one_dump_per_step_with_its_micro_batches_and_the_log(run):
    folder, recorder, iterations = run
    assert [p.name for p in recorder.written] == [f"kl_dump_step{k}_rank0.pt" for k in (1, 2, 3)]
    history = dg.read_history(folder / LOG_FILE)
    assert set(history) >= {1.0, 2.0, 3.0} and all("kl" in history[k] for k in (1.0, 2.0, 3.0))
    d = torch.load(recorder.written[0], weights_only=True)
    assert d["step"].item() == 1 and d["logprob"].dtype == torch.float32
    assert torch.equal(torch.unique(d["micro_batch"]), torch.tensor([0, 1]))  # two micro-batches
    assert ("old_logprob" in d) == (iterations > 1)


def test_every_logged_kl_is_identified_exactly(run, capsys):
    folder, _recorder, iterations = run
    assert cli.main(["diagnose", str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    checked = report["logged"]
    assert checked["offset"] == 0
    steps = checked["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        (kl,) = [it for it in s["logged"] if it["name"] == "kl"]
        assert kl["consistent"] is True, kl["note"]
        assert kl["matches"][0] == "TRL GRPO `kl`: k3 × π/π_old, token mean"
    if iterations > 1:  # the reuse step moved the policy: ρ ≠ 1 there, and the check still holds
        offp = [s["report"]["off_policy"] for s in report["series"]]
        assert any(offp)
    cli.main(["diagnose", str(folder)])
    text = capsys.readouterr().out
    assert "@1: kl =" in text and "@3: kl =" in text


def test_wrong_logged_values_are_refused(run, capsys):
    folder, recorder, _iterations = run
    history = dg.read_history(folder / LOG_FILE)
    true, previous = history[2.0]["kl"], history[1.0]["kl"]
    dump = str(recorder.written[1])
    argv = ["diagnose", dump, "--json", "--logged", f"kl={true!r}", "--logged", f"kl={3 * true!r}"]
    argv += ["--logged", f"kl={previous!r}", "--logged", "kl=0.05"]
    assert cli.main(argv) == 0
    items = json.loads(capsys.readouterr().out)["logged"]
    assert [it["consistent"] for it in items] == [True, False, False, False]
    for it in items[1:]:
        assert it["closest"]["formula"] and it["matches"] == []


def test_dumps_labelled_before_the_update_are_paired_one_step_later(run, tmp_path, capsys):
    """As a dump written in TRL's _generate_and_score_completions is: step K there is logged step K + 1."""
    folder, recorder, _iterations = run
    shifted = tmp_path / "shifted"
    shifted.mkdir()
    for p in recorder.written:
        d = torch.load(p, weights_only=True)
        k = int(d["step"])
        d["step"] = torch.tensor([k - 1])
        torch.save(d, shifted / f"kl_dump_step{k - 1}.pt")
    shutil.copy(folder / LOG_FILE, shifted / LOG_FILE)
    assert cli.main(["diagnose", str(shifted), "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)["logged"]
    assert checked["offset"] == 1 and "K + 1" in checked["note"]
    assert all(it["consistent"] for s in checked["steps"] for it in s["logged"] if it["name"] == "kl")
