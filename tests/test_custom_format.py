"""Adding a format touches its module and its reader support only: proven with a format and a
reader that exist inside this file alone.

`i8_group` (int8 weights, one float32 scale per `group_size` inputs: w = q * scale) is an
ExpertFormat registered by a fixture and removed afterwards, so the tests that iterate over
ftw.formats.FORMATS never see it. Its reader opens a made-up source (a folder named *.i8ckpt
with i8ckpt.json and one .npy per tensor) and is registered with register_opener for the
test alone. The source goes through ftw.writers.convert.convert, ftw.open, verify,
ftw.load_expert_banks, FtwFile.decode_expert and ftw check, and every decoded weight equals
the float64 formula applied to the source arrays (fresh random data, exact: int8 times a
float32 scale is exact in float64).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import ftw
from ftw.banks import LayerBanks, SourceTensor
from ftw.errors import FormatError
from ftw.formats import FORMATS, LayerFormat, ModelShape
from ftw.formats.base import BankSpec, ExpertFormat, Option, positive_int, register, split_gate_up
from ftw.readers import base as readers_base
from ftw.readers import open_checkpoint
from ftw.writers.convert import convert

NAME = "i8_group"
SUFFIX = ".i8ckpt"


class I8Group(ExpertFormat):
    name = NAME
    summary = "int8 weights, float32 scale per group_size inputs (test-only)"
    bank_names = ("gate_up", "down", "gate_up_scale", "down_scale")
    options = (Option("group_size", positive_int, "inputs per scale", required=True),)

    @classmethod
    def banks(cls, H, I, options):  # noqa: E741
        g = options["group_size"]
        return {
            "gate_up": BankSpec("gate_up", ("i8",), (2 * I, H)),
            "down": BankSpec("down", ("i8",), (H, I)),
            "gate_up_scale": BankSpec("gate_up_scale", ("f32",), (2 * I, H // g)),
            "down_scale": BankSpec("down_scale", ("f32",), (H, I // g)),
        }

    @classmethod
    def decode(cls, rows, H, I, options):  # noqa: E741
        def one(p):
            q, s = rows[p].astype(np.float64), rows[p + "_scale"].astype(np.float64)
            return q * np.repeat(s, q.shape[-1] // s.shape[-1], axis=-1)

        return split_gate_up(one("gate_up"), I, one("down"))

    @classmethod
    def decode_projection(cls, parts, options):
        q, s = np.asarray(parts["weight"], np.float64), np.asarray(parts["scale"], np.float64)
        return q * np.repeat(s, options["group_size"], axis=-1)


# -- the reader --------------------------------------------------------------------------------


class I8Reader(readers_base.CheckpointReader):
    """{path}/i8ckpt.json: {H, I, E, top_k, moe_layers, num_layers, group_size};
    L{n}.{gate,up,down}.q.npy int8 [E, out, in] and .s.npy float32 [E, out, in/g]; norm.npy."""

    def __init__(self, path: str):
        self.path = path
        self.cfg = json.loads(Path(path, "i8ckpt.json").read_text())
        c = self.cfg
        self.model = ModelShape("i8ckpt", c["H"], c["I"], c["E"], c["top_k"], c["num_layers"], c["moe_layers"])

    @property
    def name(self) -> str:
        return "test/i8ckpt"

    def _arr(self, stem: str) -> np.ndarray:
        return np.load(os.path.join(self.path, stem + ".npy"), mmap_mode="r")

    def layer_formats(self):
        return {l: LayerFormat.of(NAME, {"group_size": self.cfg["group_size"]}) for l in self.model.moe_layers}

    def plan(self, layers=None):
        out = []
        m = self.model
        for l in self.wanted_layers(layers):
            fmt = self.layer_formats()[l]

            def pair(kind, l=l):  # gate rows then up rows: two pieces of one row
                return lambda e: [self._arr(f"L{l}.gate.{kind}")[e], self._arr(f"L{l}.up.{kind}")[e]]

            def one(p, kind, l=l):
                return lambda e: [self._arr(f"L{l}.{p}.{kind}")[e]]

            scale_dtype = self.cfg.get("scale_dtype", "f32")  # a test sets another to see it refused
            lb = LayerBanks.build(l, fmt, m.hidden_size, m.intermediate_size(l), m.num_experts, {
                "gate_up": pair("q"), "down": one("down", "q"),
                "gate_up_scale": pair("s"), "down_scale": one("down", "s"),
            }, dtypes={"gate_up_scale": scale_dtype, "down_scale": scale_dtype})
            lb.reference = lambda e, l=l: {p: {"weight": self._arr(f"L{l}.{p}.q")[e], "scale": self._arr(f"L{l}.{p}.s")[e]}
                                           for p in ("gate", "up", "down")}
            out.append(lb)
        return out

    def tensors(self):
        a = self._arr("norm")
        return [SourceTensor("model.norm.weight", "f32", tuple(a.shape), lambda: np.asarray(a))]

    def attachments(self):
        return {"i8ckpt.json": Path(self.path, "i8ckpt.json").read_bytes()}

    def source_files(self):
        return sorted(str(p) for p in Path(self.path).iterdir())


def open_i8(path: str):
    return I8Reader(path) if path.endswith(SUFFIX) and os.path.isdir(path) else None


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def i8_format():
    """The format and its reader, registered for one test and removed after it."""
    assert NAME not in FORMATS
    register(I8Group)
    readers_base.register_opener(open_i8)
    try:
        yield I8Group
    finally:
        FORMATS.pop(NAME, None)
        readers_base._OPENERS.remove(open_i8)  # readers/base.py has no unregister: its list is the registry


def make_source(folder: Path, rng, H=64, I=32, E=3, g=16, moe_layers=(0, 2)) -> tuple[Path, dict]:  # noqa: E741
    src = folder / ("model" + SUFFIX)
    src.mkdir()
    cfg = {"H": H, "I": I, "E": E, "top_k": 2, "num_layers": 3, "moe_layers": list(moe_layers), "group_size": g}
    (src / "i8ckpt.json").write_text(json.dumps(cfg))
    arrays = {}
    for l in moe_layers:
        for p, (o, i) in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
            arrays[f"L{l}.{p}.q"] = rng.integers(-128, 128, (E, o, i), dtype=np.int8)
            sign = rng.choice([-1.0, 1.0], (E, o, i // g))
            arrays[f"L{l}.{p}.s"] = ((rng.random((E, o, i // g)) + 0.01) * sign).astype(np.float32)
    arrays["norm"] = rng.standard_normal(H).astype(np.float32)
    for k, a in arrays.items():
        np.save(src / f"{k}.npy", a)
    return src, arrays


def expected(arrays: dict, layer: int, e: int, g: int) -> dict[str, np.ndarray]:
    return {p: arrays[f"L{layer}.{p}.q"][e].astype(np.float64) * np.repeat(arrays[f"L{layer}.{p}.s"][e].astype(np.float64), g, -1)
            for p in ("gate", "up", "down")}


# -- tests -----------------------------------------------------------------------------------------


def test_not_registered_outside_the_fixture():
    assert NAME not in FORMATS
    assert open_i8 not in readers_base._OPENERS


@pytest.mark.parametrize("compress", [None, 3])
def test_custom_format_converts_opens_loads_decodes(tmp_path, i8_format, compress):
    rng = np.random.default_rng()
    src, arrays = make_source(tmp_path, rng)
    g, E = 16, 3
    dst = tmp_path / "out.ftw"
    plan = convert(src, dst, compress_level=compress)
    assert plan.reader == "test/i8ckpt"
    assert [(lb.layer, lb.format.name) for lb in plan.layers] == [(0, NAME), (2, NAME)]
    with ftw.open(dst) as f:
        assert f.verify() > 0
        assert {l: lf.to_json() for l, lf in f.layer_formats.items()} == {
            l: {"name": NAME, "options": {"group_size": g}} for l in (0, 2)}
        for l in (0, 2):
            f.check_layer(l)
            assert f.bank_info(l, "gate_up").dtype == "i8" and f.bank_info(l, "down_scale").row_shape == (64, 2)
            for e in range(E):
                got, want = f.decode_expert(l, e), expected(arrays, l, e, g)
                assert set(got) == set(want)
                for k in want:
                    np.testing.assert_array_equal(got[k], want[k], err_msg=f"layer {l} expert {e} {k}")
                # bytes as the source holds them: gate rows then up rows
                assert f.expert_row(l, "gate_up", e).tobytes() == arrays[f"L{l}.gate.q"][e].tobytes() + arrays[f"L{l}.up.q"][e].tobytes()
        np.testing.assert_array_equal(f.tensor("model.norm.weight"), arrays["norm"])
        assert f.attachment("i8ckpt.json") == (src / "i8ckpt.json").read_bytes()
    banks = ftw.load_expert_banks(dst)
    assert banks.layers == [0, 2] and set(banks.formats()) == {LayerFormat.of(NAME, {"group_size": g})}
    for l in (0, 2):
        for e in range(E):
            rows = {b: banks.banks[b][l][e] for b in I8Group.bank_names}
            got = I8Group.decode(rows, 64, 32, {"group_size": g})
            for k, v in expected(arrays, l, e, g).items():
                np.testing.assert_array_equal(got[k], v)


def test_runtime_without_its_kernel_refuses_it_by_name(tmp_path, i8_format):
    """Until csrc/formats/i8_group/ exists, the CPU runtime says so (no crash, no guess)."""
    runtime = pytest.importorskip("ftw.runtime")
    src, _ = make_source(tmp_path, np.random.default_rng())
    convert(src, tmp_path / "out.ftw")
    banks = ftw.load_expert_banks(tmp_path / "out.ftw")
    with pytest.raises(ftw.UnsupportedError, match="layer 0: format 'i8_group' has no CPU kernel"):
        runtime.CpuMoeExecutor(banks)


def test_custom_format_passes_ftw_check(tmp_path, i8_format):
    from ftw.check import check

    src, _ = make_source(tmp_path, np.random.default_rng())
    dst = tmp_path / "out.ftw"
    convert(src, dst)
    with open_checkpoint(src) as reader:
        report = check(reader, dst)
    assert report.ok, report


def test_custom_format_options_are_validated(tmp_path, i8_format):
    with pytest.raises(FormatError, match="'group_size'"):
        LayerFormat.of(NAME, {}, where="layer 0")
    with pytest.raises(FormatError, match="'group_size'"):
        LayerFormat.of(NAME, {"group_size": 0})
    # banks that contradict the format are refused at plan time, before the output exists
    src, _ = make_source(tmp_path, np.random.default_rng())
    cfg = json.loads((src / "i8ckpt.json").read_text())
    (src / "i8ckpt.json").write_text(json.dumps(dict(cfg, scale_dtype="f16")))
    with pytest.raises(FormatError, match="layer 0: bank 'gate_up_scale' is f16, i8_group stores it as f32"):
        convert(src, tmp_path / "bad.ftw")
    assert not (tmp_path / "bad.ftw").exists()
    # a source row of the wrong size (group 8's scales under group_size 16) is named, nothing is left
    (src / "i8ckpt.json").write_text(json.dumps(cfg))
    np.save(src / "L2.down.s.npy", np.ones((3, 64, 4), np.float32))
    with pytest.raises(ftw.SourceError, match="layer 2 bank down_scale expert 0"):
        convert(src, tmp_path / "bad.ftw")
    assert [p.name for p in tmp_path.iterdir()] == [src.name]  # no output, no temporary file


def test_file_opens_after_the_format_is_gone(tmp_path, i8_format):
    """A file of a format this ftw does not know opens (docs/FORMAT.md); decoding refuses it."""
    src, _ = make_source(tmp_path, np.random.default_rng())
    dst = tmp_path / "out.ftw"
    convert(src, dst)
    FORMATS.pop(NAME)
    try:
        with ftw.open(dst) as f:
            assert not f.layer_formats[0].known
            with pytest.raises(ftw.UnsupportedError, match=NAME):
                f.decode_expert(0, 0)
    finally:
        register(I8Group)
