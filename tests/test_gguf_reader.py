"""GGUF reader: bank bytes, dequantized values, formats, tensors, metadata, split files, samples."""

from __future__ import annotations

import hashlib
import json
import os

import gguf
import numpy as np

from ftw.formats import Activation
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize

from ftw.formats import LayerFormat
from ftw.readers.gguf_reader import METADATA_ATTACHMENT, GgufReader, open_gguf
from gguf_testlib import moe_file, source_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "samples", "gguf")
MANIFEST = json.load(open(os.path.join(SAMPLES, "manifest.json")))


@pytest.fixture
def rng(request):
    # fresh data per test, reproducible from the seed printed on failure
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    print("seed", seed)
    return np.random.default_rng(seed)


def first_files():
    return [(name, os.path.join(SAMPLES, name)) for name in MANIFEST["samples"]]


# -- bank bytes and values --------------------------------------------------------------------


MIX = {0: ("Q4_K", "Q4_K", "Q6_K"), 1: ("Q3_K", "Q5_K", "IQ4_XS"), 2: ("fused", "Q8_0", "Q4_0"),
       3: ("IQ3_S", "IQ3_S", "Q2_K"), 4: ("MXFP4", "MXFP4", "NVFP4"), 5: ("BF16", "F16", "F32")}


@pytest.fixture
def mixed(tmp_path, rng):
    built = moe_file(tmp_path / "mix.gguf", rng, MIX, E=3, bias=True)
    return built, GgufReader(built.path)


def test_bank_bytes_equal_source_bytes(mixed):
    built, r = mixed
    E = 3
    for lb in r.plan():
        p = f"blk.{lb.layer}."
        g, u, d = MIX[lb.layer]
        if g == "fused":
            want_gu = source_rows(built, p + "ffn_gate_up_exps.weight", E)
        else:
            gate, up = source_rows(built, p + "ffn_gate_exps.weight", E), source_rows(built, p + "ffn_up_exps.weight", E)
            want_gu = [a + b for a, b in zip(gate, up)]
        want_down = source_rows(built, p + "ffn_down_exps.weight", E)
        for e in range(E):
            assert lb.banks["gate_up"].row_array(e).tobytes() == want_gu[e], (lb.layer, e)
            assert lb.banks["down"].row_array(e).tobytes() == want_down[e], (lb.layer, e)
            if g != "fused":
                gb, ub = (source_rows(built, p + f"ffn_{k}_exps.bias", E)[e] for k in ("gate", "up"))
                assert lb.banks["gate_up_bias"].row_array(e).tobytes() == gb + ub
                assert lb.banks["down_bias"].row_array(e).tobytes() == source_rows(built, p + "ffn_down_exps.bias", E)[e]
        for b in lb.banks.values():
            assert b.nbytes == b.row_nbytes * E


def test_rows_are_zero_copy_views_of_the_map(mixed):
    _, r = mixed
    base = r._files[0].data
    for lb in r.plan():
        for b in lb.banks.values():
            for piece in b.row(1):
                assert np.shares_memory(piece, base)
                assert piece.flags.c_contiguous


def test_formats_one_per_distinct_type_pair(mixed):
    _, r = mixed
    fmts = r.layer_formats()
    assert fmts[0] == LayerFormat.of("gguf", {"gate_up_type": "Q4_K", "down_type": "Q6_K"})
    assert fmts[1] == LayerFormat.of("gguf", {"gate_type": "Q3_K", "up_type": "Q5_K", "down_type": "IQ4_XS"})
    assert fmts[2] == LayerFormat.of("gguf", {"gate_up_type": "Q8_0", "down_type": "Q4_0"})
    assert len(set(fmts.values())) == len(MIX)
    assert [lb.format for lb in r.plan()] == [fmts[i] for i in sorted(fmts)]


def test_row_shapes(mixed):
    _, r = mixed
    lbs = {lb.layer: lb for lb in r.plan()}
    assert lbs[0].banks["gate_up"].row_shape == (512, 144)  # 2I rows of Q4_K
    assert lbs[0].banks["down"].row_shape == (256, 210)  # H rows of Q6_K over I
    assert lbs[1].banks["gate_up"].row_shape == (256 * 110 + 256 * 176,)  # I rows of Q3_K, then of Q5_K
    assert lbs[5].banks["gate_up"].row_shape == (256 * 512 + 256 * 512,)
    assert lbs[5].banks["down"].row_shape == (256, 1024)
    assert lbs[4].banks["gate_up_bias"].dtype == "f32" and lbs[4].banks["gate_up_bias"].row_shape == (512,)


def _source_tensor(g: gguf.GGUFReader, name: str):
    t = next(t for t in g.tensors if t.name == name)
    return t.data, t.tensor_type


def test_dequantized_rows_match_gguf_dequantize_of_source(mixed):
    """gguf.quants.dequantize of a bank row equals that of the source tensor's row, read by
    gguf's own reader; and the gguf format's decoder agrees with both."""
    built, r = mixed
    g = gguf.GGUFReader(built.path)
    for lb in r.plan():
        p = f"blk.{lb.layer}."
        for e in range(3):
            rows = {k: b.row_array(e) for k, b in lb.banks.items()}
            w = lb.format.decode(rows, *lb.dims())
            down_src, down_t = _source_tensor(g, p + "ffn_down_exps.weight")
            want_down = dequantize(np.ascontiguousarray(down_src[e]), down_t)
            np.testing.assert_array_equal(w["down"], want_down)
            np.testing.assert_array_equal(dequantize(rows["down"], down_t), want_down)
            if MIX[lb.layer][0] == "fused":
                src, t = _source_tensor(g, p + "ffn_gate_up_exps.weight")
                full = dequantize(np.ascontiguousarray(src[e]), t)
                want_gate, want_up = full[:256], full[256:]
            else:
                gs, gt = _source_tensor(g, p + "ffn_gate_exps.weight")
                us, ut = _source_tensor(g, p + "ffn_up_exps.weight")
                want_gate = dequantize(np.ascontiguousarray(gs[e]), gt)
                want_up = dequantize(np.ascontiguousarray(us[e]), ut)
                np.testing.assert_array_equal(w["gate_bias"], built.values[p + "ffn_gate_exps.bias"][e])
                np.testing.assert_array_equal(w["down_bias"], built.values[p + "ffn_down_exps.bias"][e])
            np.testing.assert_array_equal(w["gate"], want_gate)
            np.testing.assert_array_equal(w["up"], want_up)
            # the quantizer really ran: values are close to the floats they came from
            if MIX[lb.layer][2] in ("Q4_0", "Q6_K", "IQ4_XS"):
                assert np.abs(w["down"] - built.values[p + "ffn_down_exps.weight"][e]).mean() < 0.02


def test_plan_filters_layers_and_touches_only_their_bytes(mixed, monkeypatch):
    built, r = mixed
    seen = []
    orig = r._view
    monkeypatch.setattr(r, "_view", lambda info: seen.append(info) or orig(info))
    lbs = r.plan([3, 1])
    assert [lb.layer for lb in lbs] == [1, 3]
    for lb in lbs:
        for b in lb.banks.values():
            for e in range(3):
                b.row(e)
    names = {i.name for i in seen}
    assert names == {f"blk.{L}.ffn_{k}_exps.{s}" for L in (1, 3) for k, s in
                     [("gate", "weight"), ("up", "weight"), ("down", "weight"),
                      ("gate", "bias"), ("up", "bias"), ("down", "bias")]}
    # and those views cover exactly the tensors' byte ranges in the file
    for i in seen:
        assert (i.offset, i.nbytes) == (built.offsets[i.name], len(built.tensors[i.name].data))


def _read_ahead_bytes() -> int:
    import glob

    kb = [int(open(p).read()) for p in glob.glob("/sys/block/*/queue/read_ahead_kb")]
    return max(kb, default=128) << 10


@pytest.mark.slow
def test_other_layers_pages_are_never_touched(tmp_path, rng):
    """The OS's view: evict the file from the page cache, read one layer, see which pages came in.

    The kernel reads around a faulting page (read_ahead_kb, 8 MB on some disks), so pages up
    to about twice that window beyond the layer's ends may come in; nothing else may."""
    import ctypes
    import mmap as _mmap

    ra = _read_ahead_bytes()
    slack = 2 * ra + (1 << 20)
    E, H = 4, 2048
    I = max(2048, -(-(3 * slack) // (3 * E * H * 34 // 32)) // 256 * 256 + 256)  # a layer > 3 slacks
    layers = {L: ("Q8_0", "Q8_0", "Q8_0") for L in range(4)}
    built = moe_file(tmp_path / "big.gguf", rng, layers, H=H, I=I, E=E, random_bytes=True)
    fd = os.open(built.path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    r = GgufReader(built.path)
    data = r._files[0].data
    page = _mmap.PAGESIZE
    npages = -(-data.size // page)
    vec = (ctypes.c_ubyte * npages)()
    libc = ctypes.CDLL(None, use_errno=True)

    def resident() -> np.ndarray:
        assert libc.mincore(ctypes.c_void_p(data.ctypes.data), ctypes.c_size_t(data.size), vec) == 0
        return np.frombuffer(vec, dtype=np.uint8).copy() & 1

    before = resident()
    if before.sum() * page > r._files[0].data_offset + slack:
        pytest.skip("the page cache keeps this file resident (cannot evict here)")
    lb = r.plan([2])[0]
    for b in lb.banks.values():
        for e in range(E):
            for p in b.row(e):
                np.asarray(p).sum()  # really fault the pages in
    now = resident()
    names = [f"blk.2.ffn_{k}_exps.weight" for k in ("gate", "up", "down")]
    lo = min(built.offsets[n] for n in names)
    hi = max(built.offsets[n] + len(built.tensors[n].data) for n in names)
    assert now[lo // page:hi // page].all()
    touched = np.flatnonzero(now) * page
    outside = touched[(touched >= r._files[0].data_offset + slack) & ((touched < lo - slack) | (touched >= hi + slack))]
    assert outside.size == 0, f"pages outside layer 2 came in: {outside[:5]}"
    assert len(touched) * page <= (hi - lo) + 3 * slack


def test_layer_not_moe_is_refused(mixed):
    _, r = mixed
    from ftw.errors import SourceError

    with pytest.raises(SourceError, match="layer 9 is not a MoE layer"):
        r.plan([9])


# -- model shape --------------------------------------------------------------------------------


def test_model_shape_from_metadata(tmp_path, rng):
    built = moe_file(tmp_path / "m.gguf", rng, {1: ("Q8_0",) * 3, 2: ("Q8_0",) * 3}, arch="deepseek2",
                     lead=1, E=4, random_bytes=True)
    m = GgufReader(built.path).model
    assert (m.hidden_size, m.moe_intermediate_size, m.num_experts, m.top_k, m.num_layers) == (256, 256, 4, 1, 3)
    assert m.moe_layers == [1, 2] and m.activation == Activation("silu") and m.family == "deepseek2"


def test_per_layer_expert_widths(tmp_path, rng):
    built = moe_file(tmp_path / "w.gguf", rng, {1: ("Q4_K",) * 3, 2: ("Q8_0",) * 3}, widths=[0, 256, 512],
                     random_bytes=True)
    r = GgufReader(built.path)
    assert r.model.moe_layers == [1, 2]
    assert r.model.moe_intermediate_size == 256 and r.model.layer_intermediate_sizes == {2: 512}
    assert r.model.to_json()["moe_intermediate_sizes"] == {"2": 512}
    lbs = r.plan()
    assert lbs[1].banks["gate_up"].row_shape == (1024, 272)
    assert lbs[1].banks["down"].row_shape == (256, 512 // 32 * 34)
    with np.errstate(all="ignore"):  # random bytes: some scales are NaN
        w = lbs[1].decode_expert(0)
    assert w["gate"].shape == (512, 256) and w["down"].shape == (256, 512)


def test_gpt_oss_activation(tmp_path, rng):
    built = moe_file(tmp_path / "g.gguf", rng, {0: ("MXFP4",) * 3}, arch="gpt-oss", bias=True, random_bytes=True)
    m = GgufReader(built.path).model
    assert m.activation == Activation("swiglu_oai", alpha=1.702, limit=7.0)


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe", "qwen3next", "gpt-oss", "deepseek2", "glm4moe",
                                  "glm-dsa", "deepseek4", "glm5-next"])
def test_archs(tmp_path, rng, arch):
    built = moe_file(tmp_path / "a.gguf", rng, {0: ("Q4_0",) * 3, 1: ("fused", "Q4_0", "Q8_0")}, arch=arch,
                     random_bytes=True)
    r = GgufReader(built.path)
    assert r.name == f"gguf/{arch}" and r.model.moe_layers == [0, 1]
    assert "unlisted_arch" not in r.model.extra


# -- non-expert tensors and metadata ------------------------------------------------------------


def test_non_expert_tensors_carried_with_their_types(mixed):
    built, r = mixed
    g = gguf.GGUFReader(built.path)
    ts = {t.name: t for t in r.tensors()}
    expert = {n for n in built.tensors if "_exps." in n}
    assert set(ts) == set(built.tensors) - expert
    for t in g.tensors:
        if t.name in expert:
            continue
        st = ts[t.name]
        assert st.meta["ggml_type"] == t.tensor_type.name
        assert st.meta["ggml_shape"] == [int(x) for x in t.shape]
        arr = st.data()
        assert arr.nbytes == st.nbytes == t.n_bytes
        assert arr.tobytes() == built.tensors[t.name].data
        assert np.shares_memory(arr, r._files[0].data)
    assert ts["token_embd.weight"].dtype == "f16" and ts["token_embd.weight"].shape == (3, 256)
    assert ts["blk.0.attn_norm.weight"].dtype == "f32" and ts["blk.0.attn_norm.weight"].shape == (256,)
    assert ts["output.weight"].dtype == "u8" and ts["output.weight"].shape == (3, 272)


def test_metadata_attachment_is_a_tensorless_gguf_with_every_key(mixed, tmp_path):
    built, r = mixed
    att = r.attachments()
    assert list(att) == [METADATA_ATTACHMENT]
    p = tmp_path / "meta.gguf"
    p.write_bytes(att[METADATA_ATTACHMENT])
    got, src = gguf.GGUFReader(p), gguf.GGUFReader(built.path)
    assert got.tensors == []
    keys = [k for k in src.fields if not k.startswith("GGUF.")]
    assert [k for k in got.fields if not k.startswith("GGUF.")] == keys
    for k in keys:
        assert got.fields[k].contents() == src.fields[k].contents(), k
        assert got.fields[k].types == src.fields[k].types, k
    assert got.fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "é"]


# -- committed samples ---------------------------------------------------------------------------


@pytest.mark.parametrize("name,path", first_files(), ids=[n for n, _ in first_files()])
def test_sample_matches_manifest(name, path):
    want = MANIFEST["samples"][name]
    for f in want["files"]:
        with open(os.path.join(SAMPLES, f), "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == want["sha256"][f], f
    r = open_gguf(path)
    assert [os.path.basename(p) for p in r.source_files()] == want["files"]
    assert {str(k): v.to_json() for k, v in r.layer_formats().items()} == want["layer_formats"]
    m = r.model.to_json()
    assert {k: m[k] for k in want["model"]} == want["model"]
    assert r.model.family == want["arch"]
    g = [gguf.GGUFReader(os.path.join(SAMPLES, f)) for f in want["files"]]
    src = {t.name: t for gr in g for t in gr.tensors}
    assert {n: t.tensor_type.name for n, t in src.items()} == want["types"]
    E = r.model.num_experts
    for lb in r.plan():
        p = f"blk.{lb.layer}."
        if p + "ffn_gate_up_exps.weight" in src:
            gu = [src[p + "ffn_gate_up_exps.weight"]]
        else:
            gu = [src[p + "ffn_gate_exps.weight"], src[p + "ffn_up_exps.weight"]]
        for e in range(E):
            assert lb.banks["gate_up"].row_array(e).tobytes() == b"".join(t.data[e].tobytes() for t in gu)
            assert lb.banks["down"].row_array(e).tobytes() == src[p + "ffn_down_exps.weight"].data[e].tobytes()
        w = lb.decode_expert(E - 1)
        np.testing.assert_array_equal(w["down"], dequantize(src[p + "ffn_down_exps.weight"].data[E - 1],
                                                              src[p + "ffn_down_exps.weight"].tensor_type))
        if want["expert_bias"]:
            np.testing.assert_array_equal(w["down_bias"], src[p + "ffn_down_exps.bias"].data[E - 1])
    carried = {t.name for t in r.tensors()}
    taken = {n for n in src if n.startswith(tuple(f"blk.{L}.ffn_" for L in r.model.moe_layers)) and "_exps." in n}
    assert carried == set(src) - taken
    for t in r.tensors():
        assert t.data().tobytes() == src[t.name].data.tobytes()


def test_split_sample_is_one_model():
    name = next(n for n in MANIFEST["samples"] if "-00001-of-" in n)
    r = open_gguf(os.path.join(SAMPLES, name))
    assert len(r.source_files()) == 2
    shards = {i.shard for i in r._infos.values()}
    assert shards == {0, 1}
    # a layer whose tensors sit in both shards still plans as one layer
    assert r.model.extra["nextn_layers"] == [3]
    assert any(t.name.startswith("blk.3.ffn_gate_exps") for t in r.tensors())  # MTP experts carried
    meta = r.attachments()[METADATA_ATTACHMENT]
    assert b"split.count" not in meta and b"tokenizer.ggml.tokens" in meta


def test_samples_are_deterministic(tmp_path):
    """Regenerating samples with the recorded seed gives the committed bytes."""
    from importlib.metadata import version

    from samples import make_gguf_samples as mk

    libs = {lib: version(lib) for lib in MANIFEST["versions"]}
    if libs != MANIFEST["versions"]:
        pytest.skip(f"samples were made with {MANIFEST['versions']}, this is {libs}")

    for s in mk.SAMPLES:
        if s.name in ("qwen3moe-Q4_K_M.gguf", "gpt-oss-MXFP4.gguf"):  # ggml K types, gguf.quants MXFP4
            mk.build(s, str(tmp_path), MANIFEST["seed"])
            got = hashlib.sha256((tmp_path / s.name).read_bytes()).hexdigest()
            assert got == MANIFEST["samples"][s.name]["sha256"][s.name], s.name


def test_open_checkpoint_picks_the_gguf_reader():
    from ftw.readers import open_checkpoint

    name = next(iter(MANIFEST["samples"]))
    with open_checkpoint(os.path.join(SAMPLES, name)) as r:
        assert isinstance(r, GgufReader) and r.name.startswith("gguf/")


def test_any_shard_opens_the_whole_model():
    first = next(n for n in MANIFEST["samples"] if "-00001-of-" in n)
    second = MANIFEST["samples"][first]["files"][1]
    a, b = open_gguf(os.path.join(SAMPLES, first)), open_gguf(os.path.join(SAMPLES, second))
    assert a.source_files() == b.source_files() and a.path == b.path
    assert a.layer_formats() == b.layer_formats()


def test_release_pages_keeps_views_valid(mixed):
    built, r = mixed
    lb = r.plan([0])[0]
    before = lb.banks["down"].row_array(1).tobytes()
    r.release_pages()
    assert lb.banks["down"].row_array(1).tobytes() == before == source_rows(built, "blk.0.ffn_down_exps.weight", 3)[1]
