"""Issue 9, sections 2 and 3, on the reader side: hostile config.json values, safetensors
headers, GGUF metadata and file names, FIFOs, indices that name one thing twice, and layers
the config does not declare. Each ends in one FtwError naming the key, tensor, layer or file,
before any output exists, and never in a traceback, a hang or a silently smaller model.

The hypothesis parts are derandomized with no database, so CI replays the same cases.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftw.errors import FtwError, SourceError
from ftw.readers import open_checkpoint
from ftw.readers.gguf_reader import GgufReader
from ftw.readers.safetensors_reader import SafetensorsReader
from ftw.writers.convert import plan_conversion
from gguf_testlib import ARR, F32, I32, STR, U32, U64, moe_file, write_gguf
from st_build import build, save

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUZZ = settings(derandomize=True, database=None, deadline=timedelta(seconds=10), max_examples=60,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


@pytest.fixture
def rng():
    seed = int.from_bytes(os.urandom(8), "little")
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def one_line_error(cls, fn, *needles):
    """fn() raises cls (an FtwError) with one line naming every needle."""
    with pytest.raises(cls) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


def set_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        c = json.load(f)
    target = c.get("text_config") or c
    for k, v in changes.items():
        if v is DELETE:
            target.pop(k, None)
        else:
            target[k] = v
    with open(path, "w") as f:
        json.dump(c, f)  # NaN and 10**400 are written as Python's json writes them


DELETE = object()


def read_all(folder):
    with SafetensorsReader(folder) as r:
        plan_conversion(r)


# -- config.json values of the wrong type or size ------------------------------------------

CONFIG_CASES = [
    ("qwen3_moe", "mlp_only_layers", 1),
    ("qwen3_moe", "mlp_only_layers", [[1]]),
    ("qwen3_moe", "decoder_sparse_step", "2"),
    ("qwen3_moe", "decoder_sparse_step", [1]),
    ("qwen3_moe", "decoder_sparse_step", 0),
    ("qwen3_moe", "num_hidden_layers", 1e8),
    ("qwen3_moe", "num_hidden_layers", 10**12),
    ("qwen3_moe", "num_hidden_layers", 1e30),
    ("qwen3_moe", "num_hidden_layers", 10**8),
    ("qwen3_moe", "num_experts", "4"),
    ("qwen3_moe", "num_experts_per_tok", 99),
    ("qwen3_moe", "hidden_size", -64),
    ("deepseek_v3", "first_k_dense_replace", "1"),
    ("deepseek_v3", "first_k_dense_replace", 1.5),
    ("deepseek_v3", "first_k_dense_replace", None),
    ("deepseek_v3", "moe_layer_freq", "1"),
    ("deepseek_v3", "num_nextn_predict_layers", 2**40),
    ("glm5_next", "first_k_dense_replace", None),
    ("glm_moe_dsa", "mlp_layer_types", "sparse"),
    ("glm_moe_dsa", "mlp_layer_types", ["sparse"]),
    ("gpt_oss", "swiglu_limit", "abc"),
    ("gpt_oss", "swiglu_limit", [7]),
    ("gpt_oss", "swiglu_limit", None),
    ("gpt_oss", "swiglu_limit", float("nan")),
    ("gpt_oss", "swiglu_limit", float("inf")),
    ("gpt_oss", "swiglu_limit", 10**400),
    ("deepseek_v4", "swiglu_limit", float("nan")),
]


@pytest.fixture(scope="module")
def family_ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("fam")
    fmts = {"qwen3_moe": ["bf16"] * 3, "deepseek_v3": [None, "bf16", "bf16"], "glm5_next": ["bf16"] * 3,
            "glm_moe_dsa": [None, "bf16", "bf16"], "gpt_oss": ["mxfp4"] * 2, "deepseek_v4": ["bf16"] * 3}
    return {fam: build(root / fam, fam, f, E=2, H=64, I=32)[0] for fam, f in fmts.items()}


@pytest.mark.parametrize("family,key,value", CONFIG_CASES, ids=[f"{f}-{k}-{v!r:.12}" for f, k, v in CONFIG_CASES])
def test_config_value_of_the_wrong_type_or_size_names_the_key(tmp_path, family_ckpts, family, key, value):
    import shutil

    folder = shutil.copytree(family_ckpts[family], tmp_path / "ck")
    set_config(folder, **{key: value})
    t = time.perf_counter()
    one_line_error(SourceError, lambda: read_all(folder), os.path.join(folder, "config.json"), key)
    assert time.perf_counter() - t < 20  # 1e30 layers once ran for minutes: a bound, not a timing


def test_deeply_nested_config_is_one_error(tmp_path, family_ckpts):
    import shutil

    folder = shutil.copytree(family_ckpts["qwen3_moe"], tmp_path / "ck")
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write('{"model_type": "qwen3_moe", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    one_line_error(SourceError, lambda: read_all(folder), "config.json", "not valid JSON")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
KEYS = ["num_hidden_layers", "hidden_size", "num_experts", "n_routed_experts", "num_local_experts",
        "moe_intermediate_size", "intermediate_size", "num_experts_per_tok", "mlp_only_layers",
        "decoder_sparse_step", "first_k_dense_replace", "moe_layer_freq", "mlp_layer_types", "swiglu_limit",
        "hidden_act", "num_nextn_predict_layers", "text_config", "quantization_config", "expert_dtype"]


@FUZZ
@given(family=st.sampled_from(["qwen3_moe", "deepseek_v3", "gpt_oss", "glm5_next", "deepseek_v4"]),
       changes=st.dictionaries(st.sampled_from(KEYS), JSON | st.integers(0, 8), min_size=1, max_size=3))
def test_fuzz_config_values_raise_only_ftw_errors(tmp_path_factory, family_ckpts, family, changes):
    import shutil

    folder = tmp_path_factory.mktemp("cfg")
    shutil.rmtree(folder)
    shutil.copytree(family_ckpts[family], folder)
    set_config(folder, **changes)
    try:
        with SafetensorsReader(str(folder)) as r:
            plan = plan_conversion(r)
            json.dumps(plan.to_json(), allow_nan=False)  # what reaches the index is strict JSON
            json.dumps(r.model.to_json(), allow_nan=False)
    except FtwError as e:
        assert "\n" not in str(e)


# -- crafted safetensors headers --------------------------------------------------------------


def raw_shard(path, header: dict | bytes, data: bytes = b"") -> None:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def small_ckpt(folder, rng, extra: dict | None = None, config: dict | None = None, drop=()) -> str:
    """A qwen3_moe checkpoint written with save(); extra tensors (st dtype, array) added."""
    folder, _ = build(folder, "qwen3_moe", ["bf16", "bf16"], E=2, H=64, I=32, seed=int(rng.integers(1 << 30)))
    if extra or drop:
        from test_readers_errors import rewrite

        rewrite(folder, drop=set(drop), add=extra)
    if config:
        set_config(folder, **config)
    return folder


@pytest.mark.parametrize("shape,needle", [
    ([0, 2**64], "too large"), ([0, 2**62, 2**62], "too large"), ([1] * 70, "70 dimensions"),
])
def test_crafted_shapes_are_refused(tmp_path, rng, shape, needle):
    folder = small_ckpt(tmp_path / "ck", rng)
    raw_shard(os.path.join(folder, "extra.safetensors"), {"odd": {"dtype": "U8", "shape": shape, "data_offsets": [0, 0]}})
    one_line_error(SourceError, lambda: read_all(folder), "extra.safetensors", "odd", needle)


def test_deeply_nested_header_and_index_are_one_error(tmp_path, rng):
    folder = small_ckpt(tmp_path / "ck", rng)
    deep = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    raw_shard(os.path.join(folder, "deep.safetensors"), deep)
    one_line_error(SourceError, lambda: read_all(folder), "deep.safetensors", "not valid JSON")
    os.remove(os.path.join(folder, "deep.safetensors"))
    with open(os.path.join(folder, "model.safetensors.index.json"), "wb") as f:
        f.write(deep)
    one_line_error(SourceError, lambda: read_all(folder), "model.safetensors.index.json", "not valid JSON")


def _expert(layer, e="0", proj="gate_proj"):
    return f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"


@pytest.mark.parametrize("name,needle", [
    (_expert("9" * 5000), "layer number"),
    (_expert(0, "9" * 5000), "expert number"),
    (_expert(0, "²"), "expert number"),
    (_expert(0, "٠"), "expert number"),  # Arabic-Indic zero next to the ASCII one
    (_expert(0, "00"), "expert number"),  # experts.00 next to experts.0
    (_expert("٣"), "layer number"),
    (_expert("01"), "layer number"),
    ("model.layers.00.input_layernorm.weight", "layer number"),
])
def test_one_name_per_expert_and_layer(tmp_path, rng, name, needle):
    """Indices are ASCII decimal without leading zeros; any other spelling is refused, never
    read as a second name for an existing expert (one tensor would silently vanish)."""
    folder = small_ckpt(tmp_path / "ck", rng)
    data = np.zeros((32, 64), np.uint16)
    raw_shard(os.path.join(folder, "extra.safetensors"),
              {name: {"dtype": "BF16", "shape": [32, 64], "data_offsets": [0, data.nbytes]}}, data.tobytes())
    msg = one_line_error(SourceError, lambda: read_all(folder), needle)
    assert len(msg) < 400, msg  # the 5000 digits are cut


HEADER_VALUE = st.one_of(
    st.lists(st.integers(0, 2**65), max_size=80), st.integers(), st.text(max_size=4), st.none(),
    st.lists(st.lists(st.integers(0, 3), max_size=2), max_size=2),
)
NAME_PART = st.one_of(st.integers(0, 4).map(str), st.text("0123456789²٠٣", min_size=1, max_size=6),
                      st.just("9" * 5000))


@FUZZ
@given(shape=HEADER_VALUE, dtype=st.sampled_from(["U8", "BF16", "F32", "F4", 7]), offsets=HEADER_VALUE,
       layer=NAME_PART, expert=NAME_PART)
def test_fuzz_safetensors_headers_raise_only_ftw_errors(tmp_path_factory, rng_module, shape, dtype, offsets,
                                                        layer, expert):
    folder = tmp_path_factory.mktemp("st")
    import shutil

    shutil.rmtree(folder)
    shutil.copytree(rng_module, folder)
    names = [_expert(layer, expert), f"model.layers.{layer}.post_attention_layernorm.weight"]
    raw_shard(os.path.join(folder, "extra.safetensors"),
              {n: {"dtype": dtype, "shape": shape, "data_offsets": offsets} for n in names}, bytes(64))
    try:
        read_all(str(folder))
    except FtwError as e:
        assert "\n" not in str(e)


@pytest.fixture(scope="module")
def rng_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base") / "ck"
    return build(folder, "qwen3_moe", ["bf16", "bf16"], E=2, H=64, I=32)[0]


# -- layers the config does not declare (section 3) -----------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2])
def test_tensors_of_undeclared_layers_are_an_error_naming_them(tmp_path, rng, n):
    folder = small_ckpt(tmp_path / "ck", rng)  # 2 layers on disk
    set_config(folder, num_hidden_layers=n)
    if n == 2:
        read_all(folder)  # honest: nothing undeclared
        return
    want = "layer 1" if n == 1 else "layers 0-1"
    one_line_error(SourceError, lambda: read_all(folder), "config.json", want, f"num_hidden_layers is {n}")


def test_mtp_layers_stay_a_named_skip(tmp_path):
    folder, _ = build(tmp_path / "ck", "deepseek_v3", [None, "bf16"], E=2, mtp=True)
    with SafetensorsReader(folder) as r:
        assert not any(t.name.startswith("model.layers.2.") for t in r.tensors())
    set_config(folder, num_nextn_predict_layers=0)  # now layer 2 is nobody's
    one_line_error(SourceError, lambda: read_all(folder), "layer 2", "num_hidden_layers is 2")


# -- refused at planning, before the output exists -----------------------------------------


@pytest.mark.parametrize("ndim", [9, 64])
def test_tensor_the_reader_would_refuse_is_refused_before_writing(tmp_path, rng, ndim):
    folder = small_ckpt(tmp_path / "ck", rng)
    raw_shard(os.path.join(folder, "extra.safetensors"),
              {"model.odd": {"dtype": "U8", "shape": [1] * ndim, "data_offsets": [0, 1]}}, b"\x07")
    dst = tmp_path / "out.ftw"
    p = cli("convert", folder, dst, rc=1)
    assert "model.odd" in p.stderr and f"{ndim} dimensions" in p.stderr and "Traceback" not in p.stderr
    assert not dst.exists() and os.listdir(tmp_path) == ["ck"]


def test_index_over_the_cap_fails_fast_at_planning(tmp_path, rng):
    folder = small_ckpt(tmp_path / "ck", rng)
    header = {("t%05d" % i) + "x" * 60_000: {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]} for i in range(1200)}
    raw_shard(os.path.join(folder, "names.safetensors"), header)
    dst = tmp_path / "out.ftw"
    t = time.perf_counter()
    p = cli("convert", folder, dst, rc=1)
    assert "index would take at least" in p.stderr and str(64 << 20) in p.stderr, p.stderr
    assert time.perf_counter() - t < 60 and not dst.exists()


# -- FIFOs and other non-regular files: refused, never waited on ----------------------------


def _in_child(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run code in a child with a timeout: a regression (a hang in open()) fails the test
    instead of hanging the suite."""
    return subprocess.run([sys.executable, "-c", f"import sys; sys.path[:0] = [{ROOT!r}]\n" + code],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("which", ["model.safetensors.index.json", "model-fifo.safetensors", "config.json"])
def test_fifo_in_a_checkpoint_folder_is_refused(tmp_path, rng, which):
    folder = small_ckpt(tmp_path / "ck", rng)
    path = os.path.join(folder, which)
    if os.path.exists(path):
        os.remove(path)
    os.mkfifo(path)
    p = _in_child(f"""
from ftw.errors import FtwError
from ftw.readers import open_checkpoint
try:
    with open_checkpoint({folder!r}) as r:
        r.plan()
except FtwError as e:
    print("FTW", e)
""")
    assert p.returncode == 0 and p.stdout.startswith("FTW"), p.stderr
    if which != "config.json":  # a FIFO config.json makes the folder not a checkpoint at all
        assert which in p.stdout and "not a regular file" in p.stdout, p.stdout


def test_fifo_gguf_and_split_shard_are_refused(tmp_path, rng):
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    moe_file(tmp_path / "s-00001-of-00002.gguf", rng, {0: ("Q8_0", "Q8_0", "Q8_0")}, random_bytes=True)
    os.mkfifo(tmp_path / "s-00002-of-00002.gguf")
    for path in (fifo, tmp_path / "s-00001-of-00002.gguf"):
        p = _in_child(f"""
from ftw.errors import FtwError
from ftw.readers.gguf_reader import GgufReader
try:
    GgufReader({str(path)!r})
except FtwError as e:
    print("FTW", e)
""")
        assert p.returncode == 0 and p.stdout.startswith("FTW"), p.stderr


# -- crafted GGUF ---------------------------------------------------------------------------

ARCH = "qwen3moe"


def gguf_kvs(**over):
    """The metadata of a 2-block qwen3moe with E=2, H=I=256; over: key -> (vtype, value[, sub])."""
    kvs = {"general.architecture": (STR, ARCH), f"{ARCH}.block_count": (U32, 2),
           f"{ARCH}.embedding_length": (U32, 256), f"{ARCH}.expert_count": (U32, 2),
           f"{ARCH}.expert_used_count": (U32, 1), f"{ARCH}.expert_feed_forward_length": (U32, 256)}
    for k, v in over.items():
        k = k if k.startswith(("general.", "split.")) else f"{ARCH}.{k}"
        if v is None:
            kvs.pop(k, None)
        else:
            kvs[k] = v
    return [(k, *v) for k, v in kvs.items()]


@pytest.fixture(scope="module")
def gguf_tensors(tmp_path_factory):
    built = moe_file(tmp_path_factory.mktemp("g") / "base.gguf", np.random.default_rng(7),
                     {0: ("Q8_0", "Q8_0", "Q8_0"), 1: ("Q8_0", "Q4_0", "Q8_0")}, random_bytes=True)
    return list(built.tensors.values())


def gguf_with(path, tensors, **over) -> str:
    write_gguf(path, gguf_kvs(**over), tensors)
    return str(path)


def test_gguf_baseline_reads(tmp_path, gguf_tensors):
    with GgufReader(gguf_with(tmp_path / "ok.gguf", gguf_tensors)) as r:
        assert r.model.moe_layers == [0, 1] and len(plan_conversion(r).layers) == 2


GGUF_CASES = [
    ("block_count_u32max", {"block_count": (U32, 2**32 - 1)}, "block_count"),
    ("block_count_2_62", {"block_count": (U64, 2**62)}, "block_count"),
    ("nextn_2_40", {"nextn_predict_layers": (U64, 2**40)}, "nextn_predict_layers"),
    ("nextn_over_blocks", {"nextn_predict_layers": (U32, 3)}, "nextn_predict_layers"),
    ("width_string", {"expert_feed_forward_length": (STR, "256")}, "expert_feed_forward_length"),
    ("width_negative", {"expert_feed_forward_length": (I32, -256)}, "expert_feed_forward_length"),
    ("width_negative_array", {"expert_feed_forward_length": (ARR, [256, -5], I32)}, "expert_feed_forward_length"),
    ("width_nested", {"expert_feed_forward_length": (ARR, [[256], [256]], ARR)}, "expert_feed_forward_length"),
    ("expert_count_0", {"expert_count": (U32, 0)}, "expert_count"),
    ("top_k_string", {"expert_used_count": (STR, "1")}, "expert_used_count"),
    ("weights_scale_nan", {"expert_weights_scale": (F32, float("nan"))}, "expert_weights_scale"),
    ("alignment_string", {"general.alignment": (STR, "32")}, "alignment"),
]


@pytest.mark.parametrize("case,over,needle", GGUF_CASES, ids=[c[0] for c in GGUF_CASES])
def test_crafted_gguf_metadata_is_one_error(tmp_path, gguf_tensors, case, over, needle):
    if over.get("expert_feed_forward_length", (0,))[0] == ARR and over["expert_feed_forward_length"][2] == ARR:
        over = {"expert_feed_forward_length": (ARR, [], ARR)}  # replaced below by hand-built bytes
        path = tmp_path / "n.gguf"
        _write_raw_kv(path, gguf_kvs(expert_feed_forward_length=None),
                      f"{ARCH}.expert_feed_forward_length", _nested(2, depth=2))
    else:
        path = gguf_with(tmp_path / f"{case}.gguf", gguf_tensors, **over)
    t = time.perf_counter()
    one_line_error(FtwError, lambda: plan_conversion(GgufReader(str(path))), needle)
    assert time.perf_counter() - t < 20


def _nested(count: int, depth: int) -> bytes:
    """An array value nested depth deep (arrays of arrays), innermost a u32 array of count."""
    inner = struct.pack("<IQ", U32, count) + struct.pack(f"<{count}I", *([256] * count))
    return struct.pack("<IQ", ARR, 1) * (depth - 1) + inner


def _write_raw_kv(path, kvs, key: str, array_value: bytes) -> None:
    from gguf_testlib import _str, _value

    head = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs) + 1)
    for k in kvs:
        head += _str(k[0]) + struct.pack("<I", k[1]) + _value(*k[1:])
    head += _str(key) + struct.pack("<I", ARR) + array_value
    with open(path, "wb") as f:
        f.write(head)


def test_gguf_arrays_nested_2000_deep(tmp_path):
    path = tmp_path / "deep.gguf"
    _write_raw_kv(path, gguf_kvs(), "general.deep", _nested(1, depth=2000))
    one_line_error(SourceError, lambda: GgufReader(str(path)), "general.deep", "nested")


def test_gguf_shape_whose_product_overflows(tmp_path, gguf_tensors):
    from gguf_testlib import T

    path = gguf_with(tmp_path / "ne.gguf", gguf_tensors + [T("odd.weight", (0, 2**64 - 1), 0, b"")])
    one_line_error(SourceError, lambda: GgufReader(path), "odd.weight", "too large")


def test_gguf_undeclared_and_non_decimal_blocks(tmp_path, gguf_tensors):
    from gguf_testlib import T

    norm = np.zeros(256, np.float32).tobytes()
    for name in ("blk.7.attn_norm.weight", "blk." + "9" * 5000 + ".attn_norm.weight", "blk.01.attn_norm.weight"):
        path = gguf_with(tmp_path / "b.gguf", gguf_tensors + [T(name, (256,), 0, norm)])
        msg = one_line_error(SourceError, lambda: GgufReader(path), "block_count = 2")
        assert len(msg) < 400


@pytest.mark.parametrize("name", ["m-00001-of-00000.gguf", "m-00003-of-00002.gguf", "m-00000-of-00002.gguf"])
def test_split_names_that_cannot_be(tmp_path, gguf_tensors, name):
    gguf_with(tmp_path / "m-00001-of-00002.gguf", gguf_tensors)
    gguf_with(tmp_path / "m-00002-of-00002.gguf", [])
    path = gguf_with(tmp_path / name, gguf_tensors)
    one_line_error(SourceError, lambda: GgufReader(path), name)


def test_split_count_as_a_string(tmp_path, gguf_tensors):
    a = gguf_with(tmp_path / "m-00001-of-00002.gguf", gguf_tensors,
                  **{"split.count": (STR, "2"), "split.no": (U32, 0)})
    gguf_with(tmp_path / "m-00002-of-00002.gguf", [], **{"split.count": (STR, "2"), "split.no": (U32, 1)})
    one_line_error(SourceError, lambda: GgufReader(a), "split.count")


GGUF_KEYS = ["block_count", "embedding_length", "expert_count", "expert_used_count", "leading_dense_block_count",
             "nextn_predict_layers", "expert_feed_forward_length", "expert_weights_scale", "general.alignment",
             "expert_shared_count", "general.architecture"]
GGUF_VALUE = st.one_of(
    st.tuples(st.just(U32), st.integers(0, 2**32 - 1)), st.tuples(st.just(I32), st.integers(-2**31, 2**31 - 1)),
    st.tuples(st.just(U64), st.integers(0, 2**64 - 1)), st.tuples(st.just(F32), st.floats(width=32)),
    st.tuples(st.just(STR), st.text(max_size=6)),
    st.tuples(st.just(ARR), st.lists(st.integers(-3, 300), max_size=4), st.just(I32)),
    st.tuples(st.just(U32), st.integers(0, 4)),
)


@FUZZ
@given(over=st.dictionaries(st.sampled_from(GGUF_KEYS), GGUF_VALUE | st.none(), min_size=1, max_size=3))
def test_fuzz_gguf_metadata_raises_only_ftw_errors(tmp_path_factory, gguf_tensors, over):
    path = tmp_path_factory.mktemp("gf") / "f.gguf"
    gguf_with(path, gguf_tensors, **over)
    try:
        with GgufReader(str(path)) as r:
            plan = plan_conversion(r)
            json.dumps(plan.to_json(), allow_nan=False)
            json.dumps(r.model.to_json(), allow_nan=False)
    except FtwError as e:
        assert "\n" not in str(e)


# -- the CLI on these inputs ------------------------------------------------------------------


def cli(*args, rc: int | None = 0) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, os.path.join(ROOT, "cli.py"), *map(str, args)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    if rc is not None:
        assert p.returncode == rc, (p.returncode, p.stdout, p.stderr)
    return p


def test_cli_layers_with_a_5000_digit_block(tmp_path, gguf_tensors):
    from gguf_testlib import T

    norm = np.zeros(256, np.float32).tobytes()
    path = gguf_with(tmp_path / "b.gguf", gguf_tensors + [T("blk." + "9" * 5000 + ".attn_norm.weight", (256,), 0, norm)])
    p = cli("convert", path, tmp_path / "o.ftw", "--layers", "0", rc=1)
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.ftw").exists()


def test_split_name_with_non_ascii_digits_is_one_file(tmp_path, gguf_tensors):
    """'m-٠٠٠٠١-of-٠٠٠٠٢.gguf' is not a split name (its digits are not ASCII): the file is
    read as the single file it is, never as shards of another name."""
    path = gguf_with(tmp_path / "m-٠٠٠٠١-of-٠٠٠٠٢.gguf", gguf_tensors)
    with GgufReader(path) as r:
        assert r.source_files() == [path]


@pytest.mark.parametrize("over", [{"expert_feed_forward_length": (ARR, [256, 0], U32)},
                                  {"leading_dense_block_count": (U32, 1)}])
def test_gguf_experts_in_a_block_the_metadata_makes_dense(tmp_path, gguf_tensors, over):
    """Block 0 has expert tensors; metadata that makes it dense would carry them as plain
    tensors and convert a layer fewer without a word: refused, naming the tensor."""
    path = gguf_with(tmp_path / "d.gguf", gguf_tensors, **over)
    if "leading_dense_block_count" in over:
        want = "block 0 dense"
    else:
        want = "block 1 dense"
    one_line_error(SourceError, lambda: GgufReader(path), want, "_exps.")
