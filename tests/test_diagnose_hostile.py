"""Hostile dumps for ``klviz diagnose``, built here byte by byte: each is refused from its header in bounded
time and memory, or read correctly with memory that does not grow; every bad input exits 2 with one line,
never 3; the output is valid UTF-8 with no raw control or bidi character; ``| head`` ends quietly.

Time and memory are measured in a fresh child process (``resource.getrusage(RUSAGE_CHILDREN)`` of a
small runner that starts only that child). Time is the child's CPU time, compared with that of a child that
reads a small valid dump in the same test run: a refusal from the header costs about what start-up costs,
the quadratic or unbounded cases cost minutes; a busy machine slows both alike and changes neither.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import struct
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from klviz import cli
from klviz import diagnose as dg
from klviz.diagnose.reading import core

# -- helpers ----------------------------------------------------------------------------------------

_RUNNER = textwrap.dedent(
    """
    import json, resource, subprocess, sys, time
    spec = json.loads(sys.argv[1])
    t0 = time.perf_counter()
    try:
        done = subprocess.run(spec["argv"], capture_output=True, timeout=spec["timeout"], env=spec["env"])
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = "timeout", b"", b""
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
    sys.stdout.write(json.dumps({"rc": rc, "wall": wall, "cpu": cpu, "peak": peak, "out": out.hex(), "err": err.hex()}))
    """
)
_CLI = "import sys; from klviz.cli import main; sys.exit(main(sys.argv[1:]))"
#: Peak resident memory allowed to a child that refuses a file from its header or reads a small dump:
#: Python, NumPy and torch take about 240 MiB; the hostile files below took 4.3 GB before.
SMALL_MIB = 450
#: A refusal from the header may cost at most this many times the CPU time of reading a small valid dump
#: (start-up included, about 3 s here); the quadratic cases cost 20 s (40k dimensions) to minutes.
LINEAR_CPU_FACTOR = 3.0


@dataclass
class Child:
    rc: int | str
    wall: float
    cpu: float  # s, user + system
    peak: float  # MiB
    out: bytes
    err: bytes

    @property
    def stderr(self) -> str:
        return self.err.decode("utf-8", "replace")


def run_child(args: list, *, env: dict | None = None, timeout: float = 300, code: str = _CLI) -> Child:
    """``klviz ARGS`` (or ``code``) in a fresh process: exit status, wall time, peak RSS, raw output."""
    full_env = dict(os.environ, **(env or {}))
    argv = [sys.executable, "-c", code, *[os.fsdecode(a) for a in args]]
    spec = json.dumps({"argv": argv, "timeout": timeout, "env": full_env})
    done = subprocess.run([sys.executable, "-c", _RUNNER, spec], capture_output=True, text=True, timeout=timeout + 60)
    r = json.loads(done.stdout)
    return Child(r["rc"], r["wall"], r["cpu"], r["peak"], bytes.fromhex(r["out"]), bytes.fromhex(r["err"]))


@pytest.fixture(scope="module")
def baseline_cpu(tmp_path_factory) -> float:
    """CPU seconds of ``klviz diagnose`` on a small valid dump, measured in this run (the yardstick of time)."""
    c = run_child(["diagnose", good_dump(tmp_path_factory.mktemp("base") / "good.npz")])
    assert c.rc == 0, c.stderr
    return c.cpu


def run_cli(argv, capsys):
    code = cli.main([os.fspath(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_bad_input(code, err, *words):
    """Exit status 2 with exactly one line on stderr naming what is wrong; never a traceback."""
    assert code == 2, (code, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("klviz: error:"), err
    assert "Traceback" not in err and "please report" not in err, err
    for w in words:
        assert w in err, (w, err)


def _batch(seed=0, B=8, T=12):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g) * 3 - 0.01
    ref = lp + 0.2 * torch.randn(B, T, generator=g)
    mask = (torch.arange(T)[None] < torch.randint(3, T + 1, (B,), generator=g)[:, None]).to(torch.int8)
    return lp, ref, mask


def good_dump(path: Path, seed=0, B=8, T=12) -> Path:
    lp, ref, mask = _batch(seed, B, T)
    return dg.save_rollouts(path, lp, ref, mask)


def npy_header(shape_text: str, descr: str = "<f8", fortran: bool = False) -> bytes:
    """A version-1 ``.npy`` header whose shape is written as given (``"(64, 64)"``, or a forged one)."""
    hdr = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape_text}, }}"
    hdr += " " * (-(len(hdr) + 11) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode("latin1")


def write_safetensors(path: Path, header: dict, data: bytes = b"") -> Path:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def rezip(src: Path, dst: Path, replace: dict[str, bytes], compression=zipfile.ZIP_STORED) -> Path:
    """A copy of a zip archive (a ``torch.save`` file) with some members' bytes replaced."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            for suffix, new in replace.items():
                if info.filename.endswith(suffix):
                    data = new
            zout.writestr(info.filename, data)
    return dst


# -- item 2: headers that would cost quadratic time -----------------------------------------------


def test_a_million_dimension_safetensors_header_is_refused_in_linear_time(tmp_path, baseline_cpu):
    entry = {"dtype": "F32", "shape": [1] * 1_000_000, "data_offsets": [0, 4]}
    p = write_safetensors(
        tmp_path / "dims.safetensors",
        {"logprob": entry, "ref_logprob": entry, "response_mask": entry},
        b"\0" * 4,
    )
    assert p.stat().st_size > 2_000_000
    c = run_child(["diagnose", p], timeout=120)
    assert_bad_input(c.rc, c.stderr, "1,000,000 dimensions", "at most 3")
    assert c.cpu < LINEAR_CPU_FACTOR * baseline_cpu and c.peak < SMALL_MIB, (c.cpu, baseline_cpu, c.peak)


def test_npz_members_with_21k_dimension_headers_are_refused_in_linear_time(tmp_path, baseline_cpu):
    shape = "(" + "1, " * 21_000 + ")"
    member = npy_header(shape) + b"\0" * 8
    p = tmp_path / "dims.npz"
    names = ["logprob", "ref_logprob", "response_mask"] + [f"x{i}" for i in range(27)]
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as z:
        for name in names:
            z.writestr(name + ".npy", member)
    assert p.stat().st_size < 20_000
    c = run_child(["diagnose", p], timeout=120)
    assert_bad_input(c.rc, c.stderr, "21,000 dimensions")
    assert c.cpu < LINEAR_CPU_FACTOR * baseline_cpu and c.peak < SMALL_MIB, (c.cpu, baseline_cpu, c.peak)


def test_an_unused_array_with_too_many_dimensions_does_not_stop_the_dump(tmp_path):
    lp, ref, mask = _batch()
    p = tmp_path / "extra.npz"
    np.savez(p, logprob=lp.numpy(), ref_logprob=ref.numpy(), response_mask=mask.numpy(), images=np.zeros((1,) * 5))
    r = dg.load_rollouts(p)
    assert torch.equal(r.logprob.float(), lp)
    with pytest.raises(dg.RolloutFileError, match="5 dimensions"):
        dg.open_dump(p, logprob_key="images")


@pytest.mark.parametrize(
    "shape", [[2, 3, 4, 5], "12", [2.0, 6], [True, 12], [-1, 12], [10**40, 10**40], {"a": 1}], ids=str
)
def test_safetensors_shapes_that_are_not_rollout_shapes(tmp_path, shape):
    entry = {"dtype": "F32", "shape": shape, "data_offsets": [0, 4 * 12]}
    good = {"dtype": "F32", "shape": [1, 12], "data_offsets": [0, 48]}
    p = write_safetensors(tmp_path / "s.safetensors", {"logprob": entry, "ref_logprob": good, "response_mask": good})
    with pytest.raises(dg.RolloutFileError) as err:
        dg.open_dump(p)
    assert "logprob" in str(err.value) and len(str(err.value)) < 300


# -- item 3: strings that would cost memory -------------------------------------------------------


def test_a_shared_string_pickle_is_refused_in_small_memory(tmp_path):
    lp, ref, mask = _batch(B=64, T=64)
    p = tmp_path / "shared.pt"
    torch.save({"logprob": lp, "ref_logprob": ref, "response_mask": mask, "tokens": [["x" * 65536] * 64] * 64}, p)
    assert p.stat().st_size < 200_000  # one string, one row, shared by the pickle
    c = run_child(["diagnose", p])
    assert_bad_input(c.rc, c.stderr, "'tokens'", "65,536 characters", "at most 256")
    assert c.peak < SMALL_MIB, c.peak


def test_a_wide_string_npz_member_is_refused_in_small_memory(tmp_path):
    p = tmp_path / "wide.npz"
    lp, ref, mask = _batch(B=64, T=64)
    chunk = ("x" * (1 << 18)).encode("utf-32-le")  # 1 MiB: four elements of <U65536
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for name, a in (("logprob", lp), ("ref_logprob", ref), ("response_mask", mask)):
            buf = io.BytesIO()
            np.save(buf, a.numpy())
            z.writestr(name + ".npy", buf.getvalue())
        with z.open("tokens.npy", "w", force_zip64=True) as f:
            f.write(npy_header("(64, 64)", "<U65536"))
            for _ in range(64 * 64 // 4):
                f.write(chunk)
    assert p.stat().st_size < 8 << 20
    c = run_child(["diagnose", p])
    assert_bad_input(c.rc, c.stderr, "'tokens'", "65,536 characters")
    assert c.peak < SMALL_MIB, c.peak


def test_a_pickle_of_many_tiny_objects_is_refused_in_small_memory(tmp_path, baseline_cpu):
    """16 MB of EMPTY_LIST opcodes (one byte each) would build 16M lists, about 1 GB; the pickle is counted."""
    lp, ref, mask = _batch()
    good = tmp_path / "good.pt"
    torch.save({"logprob": lp, "ref_logprob": ref, "response_mask": mask}, good)
    with zipfile.ZipFile(good) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    bomb = b"}" + b"X" + struct.pack("<I", 4) + b"junk" + b"(" + b"]" * (16 << 20) + b"ls0"  # {'junk': [[]...]}
    p = rezip(good, tmp_path / "lists.pt", {"data.pkl": pkl[:2] + bomb + pkl[2:]})
    c = run_child(["diagnose", p])
    assert_bad_input(c.rc, c.stderr, "2,097,152 objects")
    assert c.peak < SMALL_MIB + 150 and c.cpu < 10 * baseline_cpu, (c.peak, c.cpu, baseline_cpu)
    legacy = tmp_path / "legacy.pt"  # the same bomb as a bare pickle: looked at only as far as 1 MiB
    legacy.write_bytes(b"\x80\x02(" + b"]" * (16 << 20) + b"l.")
    c = run_child(["diagnose", legacy])
    assert_bad_input(c.rc, c.stderr, "legacy")
    assert c.peak < SMALL_MIB, c.peak


def test_dict_keys_too_long_to_print_are_described(tmp_path, capsys):
    lp, ref, mask = _batch()
    p = tmp_path / "keys.pt"
    torch.save({"logprob": lp, "ref_logprob": ref, "response_mask": mask, 10**5000: 1, (10**5000,): 2}, p)
    code, _out, err = run_cli(["diagnose", p], capsys)
    assert code == 0, err
    with pytest.raises(dg.RolloutFileError, match="about 5,001 digits"):
        dg.open_dump(p, ref_key="nope")


def test_a_large_pickle_of_token_strings_is_read_by_the_counting_unpickler(tmp_path):
    lp, ref, mask = _batch(B=200, T=500)
    tokens = [[f"t{i % 97}_{j}" for j in range(500)] for i in range(200)]
    p = tmp_path / "tokens.pt"
    torch.save({"logprob": lp, "ref_logprob": ref, "response_mask": mask, "tokens": tokens}, p)
    with zipfile.ZipFile(p) as z:
        assert next(i for i in z.infolist() if i.filename.endswith("data.pkl")).file_size > 1 << 20
    r = dg.load_rollouts(p)
    assert r.tokens[199, 499] == "t5_499" and torch.equal(r.logprob.float(), lp)


def test_strings_are_budgeted_in_bytes_not_elements(tmp_path):
    lp, ref, mask = _batch(B=10, T=10)
    p = tmp_path / "s.npz"
    tokens = np.full((10, 10), "t" * 100)  # <U100: 400 bytes an element
    np.savez(p, logprob=lp.numpy(), ref_logprob=ref.numpy(), response_mask=mask.numpy(), tokens=tokens)
    p2 = tmp_path / "s.pt"
    torch.save({"logprob": lp, "ref_logprob": ref, "response_mask": mask, "tokens": tokens.tolist()}, p2)
    for path in (p, p2):  # 100 elements, 40,000 bytes of strings: within 8 x 5,000 bytes, beyond 8 x 4,000
        assert dg.load_rollouts(path, max_tokens=5000).tokens[0, 0] == "t" * 100
        with pytest.raises(dg.RolloutFileError, match="budget"):
            dg.load_rollouts(path, max_tokens=4000)


def test_token_strings_of_a_normal_width_are_read(tmp_path, capsys):
    lp, ref, mask = _batch()
    tokens = np.array([[f"tok{j}" for j in range(12)] for _ in range(8)])
    for p in (tmp_path / "t.npz", tmp_path / "t.pt"):
        data = {"logprob": lp, "ref_logprob": ref, "response_mask": mask}
        if p.suffix == ".npz":
            np.savez(p, **{k: v.numpy() for k, v in data.items()}, tokens=tokens)
        else:
            torch.save({**data, "tokens": tokens.tolist()}, p)
        r = dg.load_rollouts(p)
        assert r.tokens.shape == (8, 12) and str(r.tokens[3, 5]) == "tok5"
        code, out, err = run_cli(["diagnose", p], capsys)
        assert code == 0, err
        assert "tok" in out


@pytest.mark.parametrize(
    "tokens,words",
    [
        ([["a"] * 12] * 7 + [["a"] * 11], ["row 7 has 11 tokens", "row 0 has 12"]),
        ([["a"] * 12] * 7 + [[1] * 12], ["row 7 holds a int", "token_ids"]),
        ([["a"] * 12] * 7 + ["abc"], ["row 7 has str tokens"]),
    ],
    ids=["ragged", "ints", "not a list"],
)
def test_ragged_or_mixed_token_lists_are_named_not_numpy_errors(tmp_path, capsys, tokens, words):
    lp, ref, mask = _batch()
    p = tmp_path / "ragged.pt"
    torch.save({"logprob": lp, "ref_logprob": ref, "response_mask": mask, "tokens": tokens}, p)
    code, _out, err = run_cli(["diagnose", p], capsys)
    assert_bad_input(code, err, "'tokens'", *words)
    assert "inhomogeneous" not in err


def test_ragged_lists_given_as_tensors_are_named(tmp_path):
    lp, ref, mask = _batch(B=2, T=4)
    for kw, name in (({"token_ids": [[1, 2, 3, 4], [3]]}, "'token_ids'"), ({"tokens": [["a"] * 4, ["c"]]}, "'tokens'")):
        with pytest.raises(dg.RolloutFileError, match=name) as err:
            dg.rollouts_from_tensors(lp, ref, mask, **kw)
        assert "inhomogeneous" not in str(err.value)
    with pytest.raises(dg.RolloutFileError, match="'logprob'") as err:
        dg.rollouts_from_tensors([[-1.0, -2.0, -1.0, -1.0], [-1.0]], ref, mask)
    assert "inhomogeneous" not in str(err.value)


# -- item 4: layouts other than rows -----------------------------------------------------------------


def _layout_dump(path: Path, order: str, compressed: bool = False, B=1024, T=4096) -> Path:
    g = np.random.default_rng(0)
    lp = -g.exponential(1.0, (B, T))
    ref = lp + 0.3 * g.standard_normal((B, T))
    mask = np.arange(T)[None] < g.integers(T // 8, T + 1, B)[:, None]
    arrays = {"logprob": lp, "ref_logprob": ref, "response_mask": mask.astype(np.int8)}
    if order == "F":
        arrays = {k: np.asfortranarray(v) for k, v in arrays.items()}
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path


@pytest.mark.slow
def test_fortran_order_dumps_stay_flat_in_memory(tmp_path):
    """[1024, 4096] float64 (32 MiB an array, twice the block read at once): the Fortran-order file is read
    through column blocks, in the memory of the C-order one; reading it whole would add > 100 MiB."""
    c_order = run_child(["diagnose", "--json", _layout_dump(tmp_path / "c.npz", "C")])
    f_order = run_child(["diagnose", "--json", _layout_dump(tmp_path / "f.npz", "F")])
    assert c_order.rc == 0 and f_order.rc == 0, (c_order.stderr, f_order.stderr)
    rep_c, rep_f = json.loads(c_order.out), json.loads(f_order.out)
    assert rep_c["estimates"] == rep_f["estimates"]
    assert f_order.peak < c_order.peak + 48, (c_order.peak, f_order.peak)


@pytest.mark.parametrize("block", [512, 64], ids=["column bands", "column pieces"])
def test_every_layout_reads_the_same_rows(tmp_path, monkeypatch, block):
    """Column-major arrays (Fortran order, transposed and sliced tensors, compressed or not) read through the
    column-block file give exactly the rows of the C-order array; a small block makes every path run (bands
    of columns, one column per read when they lie far apart, a column in pieces when it exceeds a block)."""
    monkeypatch.setattr(core, "BLOCK_BYTES", block)
    g = np.random.default_rng(1)
    lp = -g.exponential(1.0, (37, 53)).astype(np.float32)
    ref = (lp + 0.1 * g.standard_normal(lp.shape)).astype(np.float32)
    mask = (g.random(lp.shape) < 0.8).astype(np.int8)
    mask[:, 0] = 1
    np.savez(tmp_path / "c.npz", logprob=lp, ref_logprob=ref, response_mask=mask)
    np.savez(tmp_path / "f.npz", logprob=np.asfortranarray(lp), ref_logprob=ref, response_mask=np.asfortranarray(mask))
    np.savez_compressed(
        tmp_path / "fz.npz", logprob=np.asfortranarray(lp), ref_logprob=np.asfortranarray(ref), response_mask=mask
    )
    wide = torch.zeros(70, 45)
    wide[:53, 3:40] = torch.from_numpy(lp).t()
    torch.save(
        {
            "logprob": wide[:53, 3:40].t(),  # columns 3.. of a transposed tensor: strides (1, 45)
            "ref_logprob": torch.from_numpy(ref).t().contiguous().t(),
            "response_mask": torch.from_numpy(mask),
        },
        tmp_path / "t.pt",
    )
    gaps = torch.zeros(37, 1000)  # rows 1000 elements apart: read one row at a time
    gaps[:, :53] = torch.from_numpy(ref)
    far = torch.zeros(53, 200)  # columns 200 elements apart: one read per column
    far[:, :37] = torch.from_numpy(lp).t()
    torch.save(
        {"logprob": far[:, :37].t(), "ref_logprob": gaps[:, :53], "response_mask": torch.from_numpy(mask)},
        tmp_path / "g.pt",
    )
    expected = dg.load_rollouts(tmp_path / "c.npz")
    for name in ("f.npz", "fz.npz", "t.pt", "g.pt"):
        got = dg.load_rollouts(tmp_path / name)
        assert torch.equal(got.logprob, expected.logprob) and torch.equal(got.ref_logprob, expected.ref_logprob), name
        assert torch.equal(got.mask, expected.mask), name
        with dg.open_dump(tmp_path / name) as f:
            chunks = [f.rows("logprob", r0, min(37, r0 + 5)) for r0 in range(0, 37, 5)]
        assert np.array_equal(np.concatenate(chunks), lp), name
        d, d0 = dg.diagnose(tmp_path / name, chunk_tokens=200), dg.diagnose(tmp_path / "c.npz", chunk_tokens=200)
        assert d.estimates == d0.estimates, name


def test_a_strided_view_is_read_when_small_and_refused_with_advice_when_large(tmp_path, monkeypatch):
    base = -torch.rand(64, 64)
    p = tmp_path / "strided.pt"
    torch.save({"logprob": base[::2, ::2], "ref_logprob": base[:32, :32], "response_mask": torch.ones(32, 32)}, p)
    assert torch.equal(dg.load_rollouts(p).logprob.float(), base[::2, ::2])
    monkeypatch.setattr(core, "BLOCK_BYTES", 512)
    with pytest.raises(dg.RolloutFileError, match="contiguous"):
        dg.open_dump(p)


# -- item 5: one file never changes how the next is read ----------------------------------------------


def _build_then_dump(tmp_path: Path, fp16: Path) -> Path:
    """The float16 dump's own archive, with a pickle that first BUILDs torch.HalfStorage into bfloat16."""
    with zipfile.ZipFile(fp16) as z:
        pkl_name = next(n for n in z.namelist() if n.endswith("data.pkl"))
        pkl = z.read(pkl_name)
    assert pkl[:2] == b"\x80\x02"

    def text(s: str) -> bytes:  # BINUNICODE, no memo
        return b"X" + struct.pack("<I", len(s)) + s.encode()

    # GLOBAL torch.HalfStorage, {"dtype": "bfloat16"}, BUILD (set the global's dtype), POP
    preamble = b"ctorch\nHalfStorage\n}" + text("dtype") + text("bfloat16") + b"sb0"
    return rezip(fp16, tmp_path / "a_build.pt", {"data.pkl": pkl[:2] + preamble + pkl[2:]})


def test_a_pickle_build_on_an_allowed_global_changes_nothing(tmp_path, capsys):
    lp, ref, mask = _batch(B=16, T=20)
    run = tmp_path / "run"
    run.mkdir()
    fp16 = run / "b_half.pt"
    torch.save({"logprob": lp.half(), "ref_logprob": ref.half(), "response_mask": mask}, fp16)
    crafted = _build_then_dump(run, fp16)
    with pytest.raises(dg.RolloutFileError, match="HalfStorage"):
        dg.load_rollouts(crafted)
    first = dg.load_rollouts(fp16)
    with pytest.raises(dg.RolloutFileError, match="HalfStorage"):
        dg.load_rollouts(crafted)
    second = dg.load_rollouts(fp16)
    assert torch.equal(first.logprob, lp.half().double()) and torch.equal(second.logprob, first.logprob)
    # the same sequence in one `klviz diagnose DIR`: the crafted file first (by name), then the float16 dump
    code, out, err = run_cli(["diagnose", run, "--json"], capsys)
    series = json.loads(out)["series"]
    assert code == 2 and [s["file"] for s in series] == ["a_build.pt", "b_half.pt"], err
    assert "HalfStorage" in series[0]["error"]
    alone = dg.report_json(dg.diagnose(fp16))
    assert series[1]["report"]["estimates"] == json.loads(json.dumps(alone["estimates"]))
    assert series[1]["report"]["dtypes"]["logprob"] == "float16"


def test_the_allowed_globals_are_immutable_and_fresh_for_each_file():
    from klviz.diagnose.reading import pt

    a, b = pt.SafeUnpickler(io.BytesIO(b"")), pt.SafeUnpickler(io.BytesIO(b""))
    assert a.find_class("torch", "HalfStorage") is not b.find_class("torch", "HalfStorage")
    storage = a.find_class("torch", "HalfStorage")
    for attempt in (lambda: setattr(storage, "dtype", "bfloat16"), lambda: storage.__setstate__({"dtype": "x"})):
        with pytest.raises(Exception, match="change"):
            attempt()
    rebuild = a.find_class("torch._utils", "_rebuild_tensor_v2")
    with pytest.raises(Exception, match="change"):
        rebuild.__setstate__((None, {"__defaults__": (1,)}))
    assert storage.dtype == "float16"


# -- item 6: every bad input exits 2, never 3 ------------------------------------------------------------


def _deflated_npz(path: Path) -> Path:
    lp, ref, mask = _batch(B=64, T=256)
    np.savez_compressed(path, logprob=lp.numpy(), ref_logprob=ref.numpy(), response_mask=mask.numpy())
    return path


def _patch_zip(path: Path, member: str, fn) -> Path:
    """Apply ``fn(data: bytearray, local_offset, central_offset, info)`` to an archive's bytes in place."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
    central = data.find(b"PK\x01\x02")
    while central >= 0:  # the central directory entry whose name is this member
        name_len = struct.unpack("<H", data[central + 28 : central + 30])[0]
        if data[central + 46 : central + 46 + name_len] == member.encode():
            break
        central = data.find(b"PK\x01\x02", central + 4)
    assert central >= 0
    fn(data, info.header_offset, central, info)
    path.write_bytes(bytes(data))
    return path


def _bad_crc(data, local, central, info):
    crc = struct.pack("<I", info.CRC ^ 0xFFFF)
    data[local + 14 : local + 18] = crc
    data[central + 16 : central + 20] = crc


def _corrupt_deflate(data, local, central, info):
    name_len, extra_len = struct.unpack("<HH", data[local + 26 : local + 30])
    start = local + 30 + name_len + extra_len
    for i in range(start + 20, start + info.compress_size - 8, 97):
        data[i] ^= 0x5A


def _unknown_method(data, local, central, info):
    data[local + 8 : local + 10] = struct.pack("<H", 99)
    data[central + 10 : central + 12] = struct.pack("<H", 99)


@pytest.mark.parametrize(
    "patch,words",
    [(_bad_crc, ["corrupt"]), (_corrupt_deflate, ["corrupt"]), (_unknown_method, ["compression method 99"])],
    ids=["bad CRC", "corrupt deflate", "unknown compression"],
)
def test_broken_archives_exit_2(tmp_path, capsys, patch, words):
    p = _patch_zip(_deflated_npz(tmp_path / "z.npz"), "logprob.npy", patch)
    code, _out, err = run_cli(["diagnose", p], capsys)
    assert_bad_input(code, err, *words)


@pytest.mark.parametrize("change", ["truncate", "overwrite"])
def test_an_npz_changed_while_it_is_read_is_bad_input(tmp_path, change):
    p = _deflated_npz(tmp_path / "z.npz")
    size = p.stat().st_size
    with dg.open_dump(p) as f:
        if change == "truncate":
            os.truncate(p, size // 2)
        else:
            with open(p, "r+b") as fh:
                fh.seek(200)
                fh.write(os.urandom(size - 400))
        with pytest.raises(dg.RolloutFileError, match="corrupt|shorter"):
            dg.diagnose(f)


def test_deep_json_exits_2(tmp_path, capsys):
    deep = b"[" * 200_000 + b"]" * 200_000
    p = tmp_path / "deep.safetensors"
    p.write_bytes(struct.pack("<Q", len(deep)) + deep)
    code, _out, err = run_cli(["diagnose", p], capsys)
    assert_bad_input(code, err, "nests too deeply")
    vocab = tmp_path / "vocab.json"
    vocab.write_bytes(deep)
    code, _out, err = run_cli(["diagnose", good_dump(tmp_path / "g.npz"), "--vocab", vocab], capsys)
    assert_bad_input(code, err, "--vocab", "nests too deeply")


@pytest.mark.parametrize(
    "step,words",
    [
        (10**4000, ["about 4,001 digits", "int64"]),
        (10**5000, ["about 5,001 digits", "int64"]),
        (2**63, ["beyond int64"]),
        (float("nan"), ["expected a finite number"]),
        ("ten", ["one number"]),
    ],
    ids=["huge int", "beyond str", "int64 + 1", "nan", "string"],
)
def test_a_step_that_is_not_a_step_exits_2(tmp_path, capsys, step, words):
    lp, ref, mask = _batch()
    p = tmp_path / "step.pt"
    torch.save({"logprob": lp, "ref_logprob": ref, "response_mask": mask, "step": step}, p)
    code, _out, err = run_cli(["diagnose", p], capsys)
    assert_bad_input(code, err, "'step'", *words)


def _hostile_files(d: Path) -> dict[str, Path]:
    """One file of each kind that used to exit 3 or stop a run."""
    lp, ref, mask = _batch()
    files = {}
    files["huge_step"] = d / "h1.pt"
    torch.save({"logprob": lp, "ref_logprob": ref, "response_mask": mask, "step": 10**4000}, files["huge_step"])
    files["crc"] = _patch_zip(_deflated_npz(d / "h2.npz"), "logprob.npy", _bad_crc)
    files["method"] = _patch_zip(_deflated_npz(d / "h3.npz"), "ref_logprob.npy", _unknown_method)
    deep = b"[" * 100_000 + b"]" * 100_000
    files["deep"] = d / "h4.safetensors"
    files["deep"].write_bytes(struct.pack("<Q", len(deep)) + deep)
    return files


def test_a_run_reports_each_unreadable_dump_and_goes_on(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    good_dump(run / "a_good.npz")
    files = _hostile_files(run)
    code, out, err = run_cli(["diagnose", run], capsys)
    assert code == 2, err
    assert "a_good.npz" in out and out.count("unreadable") == len(files), out
    assert "Traceback" not in err and "please report" not in err and f"{len(files)} of {len(files) + 1} dumps" in err
    code, out, err = run_cli(["diagnose", run, "--json"], capsys)
    series = json.loads(out)["series"]
    assert code == 2 and sum("error" in s for s in series) == len(files) and len(series) == len(files) + 1


def test_statuses_agree_for_one_file_and_for_a_folder(tmp_path, capsys):
    lp, ref, mask = _batch()
    bad = tmp_path / "bad"
    bad.mkdir()
    _hostile_files(bad)
    assert run_cli(["diagnose", bad], capsys)[0] == 2  # every dump unreadable
    for p in sorted(bad.iterdir()):
        assert run_cli(["diagnose", p], capsys)[0] == 2
    nan = tmp_path / "nan"
    nan.mkdir()
    good_dump(nan / "a.npz")
    lp_nan = lp.clone()
    lp_nan[0, 0] = float("nan")
    dg.save_rollouts(nan / "b.npz", lp_nan, ref, mask)
    assert run_cli(["diagnose", nan / "b.npz"], capsys)[0] == 2
    code, _out, err = run_cli(["diagnose", nan], capsys)
    assert code == 2 and "NaN or inf" in err and "b.npz" in err
    ok = tmp_path / "ok"
    ok.mkdir()
    good_dump(ok / "a.npz")
    good_dump(ok / "b.npz", seed=1)
    assert run_cli(["diagnose", ok], capsys)[0] == 0
    assert run_cli(["diagnose", ok / "a.npz"], capsys)[0] == 0


def test_help_documents_every_status(capsys):
    with pytest.raises(SystemExit):
        cli.main(["diagnose", "--help"])
    out = capsys.readouterr().out
    block = out[out.index("exit status") :]
    for status in ("0 ", "1 ", "2 ", "3 "):
        assert f"\n  {status}" in block, block
    assert "| head" in block and "folder" in block


# -- item 7: output ---------------------------------------------------------------------------------------


def test_json_is_valid_utf8_whatever_the_file_names(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    names = [b"bad\xff.npz", "c1\u009b[31m.npz".encode(), "bidi\u202etxt.npz".encode()]
    paths = [Path(os.fsdecode(os.fsencode(run) + b"/" + name)) for name in names]
    for i, path in enumerate(paths):
        good_dump(path, seed=i)
    raw = ("\u009b", "\u202e", "\x1b", "\udcff")
    for env, target in (({"PYTHONIOENCODING": "utf-8"}, run), ({"LC_ALL": "C.UTF-8"}, paths[0])):
        c = run_child(["diagnose", "--json", target], env=env)  # in a real process: the real stdout
        assert c.rc == 0, c.stderr
        text = c.out.decode("utf-8")  # strict: raises on invalid UTF-8
        json.loads(text)
        assert not any(ch in text for ch in raw) and "\\udcff" in text, env
    for encoding in ("utf-8", "ascii"):  # the text report, through an output that cannot hold everything
        out = io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="strict")
        monkeypatch.setattr(sys, "stdout", out)
        assert cli.main(["diagnose", str(run)]) == 0
        out.flush()
        text = out.buffer.getvalue().decode(encoding)
        assert not any(ch in text for ch in raw) and "bidi" in text and "\\u202e" in text, text


@pytest.mark.parametrize("extra", [[], ["--json"]], ids=["text", "json"])
def test_a_reader_that_stops_early_ends_the_output_quietly(tmp_path, extra):
    p = good_dump(tmp_path / "g.npz", B=64, T=64)
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, "diagnose", str(p), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # `| head -0`: the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "BrokenPipe" not in err and "Traceback" not in err and "Exception ignored" not in err, err


def test_extreme_values_are_formatted_sanely(tmp_path, capsys):
    lp, ref, mask = _batch(B=16, T=20)
    ref[0, 0] = lp[0, 0] + 700.0  # log r = 700: r = 1e304, r² overflows
    ref[1, 1] = lp[1, 1] - 3e38
    p = dg.save_rollouts(tmp_path / "x.npz", lp, ref, mask)
    c = run_child(["diagnose", p])
    out = c.out.decode()
    assert c.rc in (0, 2) and "Traceback" not in c.stderr, c.stderr
    assert "Warning" not in c.stderr and len(c.stderr.strip().splitlines()) <= 1, c.stderr
    assert "nan%" not in out and "inf%" not in out
    assert not re.search(r"\d{20,}", out.replace(",", "")), out


def test_a_fifo_is_not_called_empty_and_is_never_waited_on(tmp_path, capsys):
    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    code, _out, err = run_cli(["diagnose", fifo], capsys)  # would block forever if it were opened for reading
    assert_bad_input(code, err, "not a regular file", "FIFO")
    assert "empty" not in err


def test_a_vocab_that_is_a_device_is_named_as_one(tmp_path, capsys):
    p = good_dump(tmp_path / "g.npz")
    code, _out, err = run_cli(["diagnose", p, "--vocab", "/dev/zero"], capsys)
    assert_bad_input(code, err, "--vocab", "character device")
    assert "no such file" not in err
    code, _out, err = run_cli(["diagnose", p, "--vocab", tmp_path / "missing.json"], capsys)
    assert_bad_input(code, err, "--vocab", "no such file")


@pytest.mark.parametrize("seed", ["1e20", "100000000000000000000", "-1", "x"])
def test_an_out_of_range_seed_names_the_option(capsys, seed):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["audit", "x.py:f", "--seed", seed])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--seed" in err and "Overflow" not in err


def test_one_line_errors_name_the_file_kind(tmp_path, capsys):
    code, _out, err = run_cli(["diagnose", "/dev/null.npz"], capsys)
    assert_bad_input(code, err, "no such file")
    link = tmp_path / "dev.npz"
    link.symlink_to("/dev/zero")
    code, _out, err = run_cli(["diagnose", link], capsys)
    assert_bad_input(code, err, "character device")


def test_the_judge_checks_dtype_then_dimensions_then_elements_then_bytes():
    limits = core.Limits(100)
    assert limits.max_bytes == 800
    f8, s9 = np.dtype("f8"), np.dtype("S9")
    assert core.judge("a", [10, 10], f8, limits).shape == (10, 10)
    with pytest.raises(dg.RolloutFileError, match="budget"):
        core.judge("a", [10, 10], s9, limits)
    with pytest.raises(dg.RolloutFileError, match="cap"):
        core.judge("a", [10, 11], np.dtype("i1"), limits)
    assert math.prod(core.judge("a", [0, 10**6], f8, core.Limits(10**6)).shape) == 0
    with pytest.raises(dg.RolloutFileError, match="~1e5000"):
        core.judge("a", [10**5000, 1], f8, limits)
    for dtype, words in ((np.dtype("O"), "pickled"), (np.dtype("c16"), "expected numbers"), (np.dtype("U0"), "empty")):
        with pytest.raises(dg.RolloutFileError, match=words):
            core.judge("a", [2, 2], dtype, limits)
