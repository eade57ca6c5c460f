"""A tiny character-level language model with real log-probabilities: reference, old and new.

RLHF code compares three states of one model on the same tokens: the frozen **reference** (the
model after supervised training), the **old** policy that sampled the rollouts, and the **new**
policy being updated on them. This module ships all three for a character-level neural n-gram
model (the last 16 characters through one tanh layer, about 45k parameters, a 32-token
vocabulary), trained by ``scripts/train_tiny_lm.py`` on a corpus the repo generates
(``klviz/data/tiny_corpus.txt``), so every lesson can show real prompts and responses, per-token log-probabilities of
the sampled tokens, and the full next-token distributions (hence the *exact* KL at every position
beside every estimate). No download: the weights are package data, read with ``importlib.resources``.

API at a glance::

    from klviz import lm
    ref, old, new = (lm.load_tiny_lm(s) for s in ("ref", "old", "new"))
    gen = klviz.make_generator(0)
    ro = lm.sample_rollouts(old, lm.PROMPTS[:8], gen, max_new_tokens=40)   # tokens from pi_old
    ro.logprobs                       # [B, T] log pi_old(token_t | tokens_<t), 0 where nothing was sampled
    lm.logprobs_of(new, ro)           # [B, T] log pi_new of the same tokens (rescoring)
    lm.next_token_logprobs(old, ro)   # [B, T, V] full log-distributions at every position
    ro.response_mask                  # [B, T] 1 on response tokens up to and including the first EOS
    lm.update_path()                  # [old, step 1, ..., new]: the policy after each update step
    lm.update_batch()                 # the 60-row batch of old's rollouts those steps were taken on
    ro.response_layout(x), ro.response_layout_mask   # [B, R] response-only layout (verl/TRL/MiniMind style)
    lm.reward(ro.responses, ro.finished)              # the programmatic reward of each response

Layout of a batch (one row per rollout, right-padded, the same for every tensor)::

    position   0     1 .. P_b        P_b+1 .. P_b+L_b      after
    token      BOS   prompt chars    response (ends EOS)   PAD
    mask       0     0               1                     0

Position ``t`` holds the token predicted from positions ``< t``; ``logprobs[b, t]`` is the
sampler's log-probability of ``input_ids[b, t]``. A response that reaches ``max_new_tokens``
without EOS is truncated (all its tokens stay in the mask and ``finished[b]`` is False).
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.abc import Traversable
from typing import Any, ParamSpec, TypeVar

import torch
from torch import nn

from .devices import check_generator, resolve_device, single_thread
from .validation import check_positive_int

__all__ = [
    "VOCAB",
    "PAD",
    "BOS",
    "EOS",
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "STATES",
    "PROMPTS",
    "encode",
    "decode",
    "TinyLM",
    "load_tiny_lm",
    "update_path",
    "num_update_steps",
    "Rollouts",
    "sample_rollouts",
    "logprobs_of",
    "next_token_logprobs",
    "reward",
    "POSITIVE_WORDS",
    "NEGATIVE_WORDS",
    "update_batch",
    "corpus",
    "token_strings",
    "UPDATE_BATCH_SEED",
]

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
#: The vocabulary: three special tokens, then the characters the corpus uses.
VOCAB: tuple[str, ...] = (PAD, BOS, EOS, " ", ".", *"abcdefghijklmnopqrstuvwxyz", ",")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
_CHAR_TO_ID = {c: i for i, c in enumerate(VOCAB) if i > 2}

#: The states shipped with the package (``update_path`` gives the steps between old and new).
STATES = ("ref", "old", "new")

#: Prompts of different lengths (subjects from the corpus); the model continues each sentence.
PROMPTS: tuple[str, ...] = (
    "the cat",
    "a dog",
    "my old friend",
    "the little bird",
    "our teacher",
    "a girl",
    "the farmer",
    "my sister",
    "a small boy",
    "the baker",
)

#: The programmatic reward: +1 per positive word, -1 per negative word, -1 if no EOS was reached.
POSITIVE_WORDS = ("happy", "kind", "good", "warm", "bright")
NEGATIVE_WORDS = ("sad", "bad", "cold", "dark", "angry")

# architecture (fixed: the shipped weights are for it)
CONTEXT = 16
EMBED_DIM = 12
HIDDEN_DIM = 192


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _single_threaded(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with single_thread():
            return fn(*args, **kwargs)

    return wrapper


def encode(text: str) -> list[int]:
    """Character ids of ``text`` (no BOS/EOS added); unknown characters raise ``ValueError``."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    try:
        return [_CHAR_TO_ID[c] for c in text]
    except KeyError as err:
        raise ValueError(
            f"text contains {err.args[0]!r}, which is not in the tiny model's vocabulary "
            f"(lower-case letters, space, '.' and ',')"
        ) from None


def decode(ids: Sequence[int] | torch.Tensor, *, specials: bool = False) -> str:
    """Text of a sequence of ids; special tokens are dropped unless ``specials=True``."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    out = []
    for i in ids:
        i = int(i)
        if not 0 <= i < len(VOCAB):
            raise ValueError(f"ids contains {i}, outside the vocabulary 0..{len(VOCAB) - 1}")
        if i > 2 or specials:
            out.append(VOCAB[i])
    return "".join(out)


def token_strings(ids: Sequence[int] | torch.Tensor) -> list[str]:
    """One printable string per id (``<eos>``, ``<pad>``, ``␣`` for a space) for token strips."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    return ["␣" if VOCAB[int(i)] == " " else VOCAB[int(i)] for i in ids]


class TinyLM(nn.Module):
    """A neural n-gram model (Bengio et al. 2003; makemore part 2): the last ``CONTEXT`` characters,
    embedded and concatenated, through one tanh hidden layer to next-character logits.

    ``forward(ids [B, T]) -> logits [B, T, V]``: ``logits[:, t]`` is the next-token distribution
    after reading ``ids[:, :t+1]`` (it sees ``ids[:, t-CONTEXT+1 : t+1]``; positions before the
    start count as PAD), so the log-probability of ``ids[:, t]`` is read from ``logits[:, t-1]``.
    Causal by construction: right padding never changes earlier outputs, which is why every batch
    here is right-padded. About 45k parameters; a [64, 48] batch takes a few ms on one CPU core.
    """

    def __init__(
        self,
        vocab_size: int = len(VOCAB),
        context: int = CONTEXT,
        embed_dim: int = EMBED_DIM,
        hidden_dim: int = HIDDEN_DIM,
    ):
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.hidden = nn.Linear(context * embed_dim, hidden_dim)
        self.head = nn.Linear(hidden_dim, vocab_size)

    def window_logits(self, windows: torch.Tensor) -> torch.Tensor:
        """Next-token logits from ``windows [..., CONTEXT]`` of token ids (oldest first)."""
        e = self.embed(windows).flatten(-2)
        h = self.hidden(e)
        del e  # without gradients its memory is free before the next layer's: a [200, 56] batch peaks 8 MB lower
        return self.head(h.tanh_())  # in place (the same numbers): the hidden layer's backward needs e, not h

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        padded = nn.functional.pad(ids, (self.context - 1, 0), value=PAD_ID)
        return self.window_logits(padded.unfold(-1, self.context, 1))


# ---------------------------------------------------------------------------------------------
# loading the shipped states
# ---------------------------------------------------------------------------------------------
def _data_file(name: str) -> Traversable:
    # one name per joinpath: Traversable.joinpath takes a single one before Python 3.11
    return importlib.resources.files("klviz").joinpath("data").joinpath(name)


def _load_state_dict(name: str) -> dict[str, Any]:
    ref = _data_file(name)
    if not ref.is_file():
        raise FileNotFoundError(f"klviz/data/{name} is missing: reinstall klviz or run scripts/train_tiny_lm.py")
    with ref.open("rb") as fh:
        return torch.load(fh, map_location="cpu", weights_only=True)


def _model_from_state(state_dict: dict, device: torch.device) -> TinyLM:
    model = TinyLM()
    model.load_state_dict(state_dict)
    model.eval().requires_grad_(False)
    return model.to(device)


def load_tiny_lm(state: str = "ref", device: str | torch.device | None = "cpu") -> TinyLM:
    """One shipped state of the tiny model, in eval mode with gradients off.

    ``state``: ``"ref"`` (trained on the corpus: the frozen reference), ``"old"`` (the reference
    after policy-gradient steps on :func:`reward`: the policy that samples a rollout batch) or
    ``"new"`` (old after :func:`num_update_steps` more update steps on old's batch). ``device``
    defaults to the CPU (the model is tiny: a GPU only adds launch overhead); ``None`` or
    ``"auto"`` picks the default device. Call ``.requires_grad_(True)`` to train a copy.
    """
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(map(repr, STATES))}; got {state!r}")
    return _model_from_state(_load_state_dict(f"tiny_lm_{state}.pt"), resolve_device(device))


def num_update_steps() -> int:
    """How many update steps lead from the old state to the new one (the length of the path - 1)."""
    return len(_load_state_dict("tiny_lm_path.pt")) + 1


def update_path(device: str | torch.device | None = "cpu") -> list[TinyLM]:
    """``[old, after step 1, ..., new]``: the policy after each update on old's rollout batch.

    The steps are real policy-gradient steps (``scripts/train_tiny_lm.py``), so the new policy
    drifts away from the old one the way a PPO inner loop does; a panel can score every state once.
    """
    dev = resolve_device(device)
    middle = _load_state_dict("tiny_lm_path.pt")
    steps = [middle[k] for k in sorted(middle, key=lambda s: int(s.split("_")[-1]))]
    return [load_tiny_lm("old", dev)] + [_model_from_state(sd, dev) for sd in steps] + [load_tiny_lm("new", dev)]


# ---------------------------------------------------------------------------------------------
# rollouts
# ---------------------------------------------------------------------------------------------
@dataclass
class Rollouts:
    """A batch of sampled responses in the right-padded layout described in the module docstring.

    ``input_ids``, ``attention_mask``, ``response_mask``, ``logprobs``: ``[B, T]``.
    ``prompt_lengths``/``response_lengths``: ``[B]`` (the response length counts the EOS).
    ``finished``: ``[B]`` bool, True when the response ended with EOS. ``logprobs`` are the
    sampler's log-probabilities of the sampled response tokens (0 outside the response mask).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    prompt_lengths: torch.Tensor
    response_lengths: torch.Tensor
    finished: torch.Tensor
    prompts: list[str] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def responses(self) -> list[str]:
        """The response texts (EOS and padding dropped)."""
        return [decode(self.input_ids[b][self.response_mask[b].bool()]) for b in range(self.batch_size)]

    def response_slice(self, b: int) -> slice:
        """Positions of row ``b``'s response tokens (the EOS included) in the ``[B, T]`` tensors."""
        start = 1 + int(self.prompt_lengths[b])
        return slice(start, start + int(self.response_lengths[b]))

    @property
    def response_width(self) -> int:
        """The longest response (EOS included): the width of :meth:`response_layout` tensors."""
        return max(1, int(self.response_lengths.max()))

    def response_layout(self, values: torch.Tensor) -> torch.Tensor:
        """``values [B, T, ...]`` re-laid as ``[B, R, ...]``: each row's response tokens moved to the
        left, zeros after its end. This is how verl, OpenRLHF, TRL and MiniMind store per-token
        tensors (one column per response token); pass the mask through it too
        (:attr:`response_layout_mask`).
        """
        if not isinstance(values, torch.Tensor) or values.shape[:2] != self.input_ids.shape:
            raise ValueError(f"values must be a tensor whose first two dimensions are {tuple(self.input_ids.shape)}")
        width = self.response_width
        out = values.new_zeros((self.batch_size, width, *values.shape[2:]))
        for b in range(self.batch_size):
            sl = self.response_slice(b)
            out[b, : sl.stop - sl.start] = values[b, sl]
        return out

    @property
    def response_layout_mask(self) -> torch.Tensor:
        """``[B, R]`` float mask of the response tokens in :meth:`response_layout` (EOS included)."""
        cols = torch.arange(self.response_width, device=self.response_lengths.device)
        return (cols[None, :] < self.response_lengths[:, None]).float()

    def to(self, device: str | torch.device) -> Rollouts:
        dev = torch.device(device)
        return Rollouts(
            self.input_ids.to(dev),
            self.attention_mask.to(dev),
            self.response_mask.to(dev),
            self.logprobs.to(dev),
            self.prompt_lengths.to(dev),
            self.response_lengths.to(dev),
            self.finished.to(dev),
            prompts=list(self.prompts),
        )


def _model_device(model: nn.Module) -> torch.device:
    if not isinstance(model, TinyLM):
        raise ValueError(f"model must be a klviz.lm.TinyLM (from load_tiny_lm), got {type(model).__name__}")
    return next(model.parameters()).device


@_single_threaded
@torch.no_grad()
def sample_rollouts(
    model: TinyLM,
    prompts: Sequence[str],
    generator: torch.Generator,
    max_new_tokens: int = 40,
    temperature: float = 1.0,
    stop_at_eos: bool = True,
) -> Rollouts:
    """Sample one response per prompt from ``model``, token by token, with ``generator``.

    The prompts are fed in teacher-forced (each row has its own length), then each row samples
    until EOS or ``max_new_tokens``; rows that finished early are padded with PAD. With
    ``temperature`` 1 the returned ``logprobs`` are exactly the sampler's log-probabilities (at
    another temperature they are those of the tempered distribution that actually sampled).
    Same generator seed, same prompts, same model: the same batch.

    ``stop_at_eos=False`` imitates a batched generator that keeps sampling every row until the
    longest one is done: rows go on past their EOS, ``response_mask`` marks *every* generated
    token and ``response_lengths`` counts them all (``finished`` still says whether an EOS
    appeared). :func:`klviz.tokens.minimind_response_mask` cuts such rows at the first EOS.
    """
    dev = _model_device(model)
    if not isinstance(generator, torch.Generator):
        raise ValueError(
            f"generator must be a torch.Generator (klviz.make_generator(seed)), got {type(generator).__name__}"
        )
    check_generator(generator, dev)
    if isinstance(prompts, str) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of strings")
    max_new = check_positive_int(max_new_tokens, "max_new_tokens")
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    encoded = [encode(p) for p in prompts]
    bsz = len(encoded)
    plen = torch.tensor([len(e) for e in encoded], dtype=torch.long)
    total = 1 + int(plen.max()) + max_new
    ids = torch.full((bsz, total), PAD_ID, dtype=torch.long)
    ids[:, 0] = BOS_ID
    for b, e in enumerate(encoded):
        ids[b, 1 : 1 + len(e)] = torch.tensor(e, dtype=torch.long)
    logprobs = torch.zeros(bsz, total)
    resp_mask = torch.zeros(bsz, total)
    done = torch.zeros(bsz, dtype=torch.bool)
    finished = torch.zeros(bsz, dtype=torch.bool)
    n_new = torch.zeros(bsz, dtype=torch.long)
    ids_dev = ids.to(dev)
    ctx = model.context
    padded = nn.functional.pad(ids_dev, (ctx, 0), value=PAD_ID)  # padded[:, j + ctx] = ids[:, j]
    for t in range(1, total):
        in_prompt = t <= plen  # position t is still a prompt character
        sampling = ~in_prompt & ~done
        if not bool(sampling.any()):
            if bool((~in_prompt).all()):
                break
            continue
        logits = model.window_logits(padded[:, t : t + ctx])  # ids[:, t-ctx : t]
        logp = torch.log_softmax(logits.float() / temperature, -1)
        tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        tok_cpu = tok.cpu()
        s = sampling
        ids[s, t] = tok_cpu[s]
        padded[:, t + ctx] = ids[:, t].to(dev)
        logprobs[s, t] = logp.gather(1, tok[:, None]).squeeze(1).cpu()[s]
        resp_mask[s, t] = 1.0
        n_new[s] += 1
        hit_eos = s & (tok_cpu == EOS_ID)
        finished |= hit_eos
        done |= (hit_eos if stop_at_eos else torch.zeros_like(hit_eos)) | (s & (n_new >= max_new))
        if bool((~in_prompt).all()) and bool(done.all()):
            total = t + 1
            break
    ids, logprobs, resp_mask = ids[:, :total], logprobs[:, :total], resp_mask[:, :total]
    attn = (ids != PAD_ID).float()
    return Rollouts(
        ids.to(dev),
        attn.to(dev),
        resp_mask.to(dev),
        logprobs.to(dev),
        plen.to(dev),
        n_new.to(dev),
        finished.to(dev),
        prompts=list(prompts),
    )


def _check_rollouts(rollouts: Rollouts) -> None:
    if not isinstance(rollouts, Rollouts):
        raise ValueError(f"rollouts must be a klviz.lm.Rollouts (from sample_rollouts), got {type(rollouts).__name__}")


@_single_threaded
def next_token_logprobs(model: TinyLM, rollouts: Rollouts) -> torch.Tensor:
    """``[B, T, V]`` log-distributions: row ``[b, t]`` is ``log pi(· | input_ids[b, :t])``.

    Position 0 (BOS, never predicted) holds the uniform ``log(1/V)`` so that every tensor stays
    aligned with ``input_ids``. Computed without gradients unless the model's parameters require
    them (then it can be differentiated, e.g. for a policy-gradient step on a trainable copy).
    """
    _check_rollouts(rollouts)
    dev = _model_device(model)
    ids = rollouts.input_ids.to(dev)
    with torch.set_grad_enabled(any(p.requires_grad for p in model.parameters())):
        logits = model(ids[:, :-1]).float()
        logp = torch.log_softmax(logits, -1)
        first = torch.full_like(logp[:, :1], -float(torch.log(torch.tensor(float(len(VOCAB))))))
        return torch.cat([first, logp], 1)


def logprobs_of(model: TinyLM, rollouts: Rollouts) -> torch.Tensor:
    """``[B, T]``: ``model``'s log-probability of every token of ``rollouts`` (0 outside the response mask).

    This is how a trainer rescores the sampler's tokens with another state (new policy, reference).
    """
    logp = next_token_logprobs(model, rollouts)
    ids = rollouts.input_ids.to(logp.device)
    tok = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return tok * rollouts.response_mask.to(tok.device)


def reward(texts: Sequence[str], finished: Sequence[bool] | torch.Tensor | None = None) -> torch.Tensor:
    """The programmatic reward of each response: #positive words - #negative words, -1 if unfinished."""
    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings, not one string")
    out = []
    fin = [True] * len(texts) if finished is None else [bool(f) for f in finished]
    if len(fin) != len(texts):
        raise ValueError(f"finished has {len(fin)} entries but texts has {len(texts)}")
    for text, f in zip(texts, fin):
        words = text.replace(".", " ").replace(",", " ").split()
        score = sum(w in POSITIVE_WORDS for w in words) - sum(w in NEGATIVE_WORDS for w in words)
        out.append(float(score) - (0.0 if f else 1.0))
    return torch.tensor(out)


#: The rollout batch that the shipped old → new update steps were trained on: every prompt
#: ``UPDATE_BATCH_REPEATS`` times, sampled from ``old`` with ``make_generator(UPDATE_BATCH_SEED)``.
UPDATE_BATCH_SEED = 2024
UPDATE_BATCH_REPEATS = 6
UPDATE_BATCH_MAX_NEW_TOKENS = 48


def update_batch(old: TinyLM | None = None, device: str | torch.device | None = "cpu") -> Rollouts:
    """Old's rollout batch (60 rows) on which the steps of :func:`update_path` were taken.

    Re-sampled from the shipped ``old`` state with the fixed seed, so it is the same batch
    wherever the package is installed (up to float rounding of a different CPU, which can flip a
    rare near-tie between two tokens).
    """
    from .devices import make_generator

    model = load_tiny_lm("old", device) if old is None else old
    dev = _model_device(model)
    prompts = [p for p in PROMPTS for _ in range(UPDATE_BATCH_REPEATS)]
    return sample_rollouts(
        model, prompts, make_generator(UPDATE_BATCH_SEED, dev), max_new_tokens=UPDATE_BATCH_MAX_NEW_TOKENS
    )


def corpus() -> list[str]:
    """The sentences the reference model was trained on (``klviz/data/tiny_corpus.txt``)."""
    return _data_file("tiny_corpus.txt").read_text().splitlines()
