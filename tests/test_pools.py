"""Slot pools through the host twin (no GPU): planner tables, per-pool LRU and LRFU against a
Python reference, isolation between pools, staging, zero-byte banks, and slot bytes equal to
the host banks after a long random sequence of decode and prefill steps."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from ftw.errors import FormatError
from ftw.formats import LayerFormat
from ftw.loader import ExpertBanks
from ftw.runtime.pools import CapacityError, SlotPools, format_row_bytes, plan_model

E, TOP_K, H, I = 16, 2, 64, 32  # noqa: E741
BF16 = LayerFormat.of("bf16")
NVFP4 = LayerFormat.of("nvfp4")
FP8 = LayerFormat.of("fp8_block")
FP8_32 = LayerFormat.of("fp8_block", {"block_size": [32, 32]})  # same name, other options: own pool
LAYERS = {0: BF16, 1: NVFP4, 2: NVFP4, 3: NVFP4, 4: FP8, 5: FP8, 6: FP8_32, 7: BF16}


def make_banks(rng: np.random.Generator, layers=LAYERS) -> ExpertBanks:
    """Random bytes in every bank (rows as flat bytes: the pools only move bytes)."""
    rows = {l: format_row_bytes(f, H, I) for l, f in layers.items()}
    names = sorted({b for r in rows.values() for b in r})
    banks = {n: {l: rng.integers(0, 256, (E, rows[l][n]), dtype=np.uint8) if n in rows[l]
                 else np.empty((E, 0), np.uint8) for l in layers} for n in names}
    return ExpertBanks(banks, dict(layers), E)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# -- the planner ----------------------------------------------------------------------------

MIXED_60 = {l: (BF16 if l in (0, 59) else NVFP4) for l in range(60)}


@pytest.mark.parametrize("share,bf16_slots,nvfp4_slots", [(0.1, 128, 640), (0.2, 128, 1408), (0.3, 128, 2176)])
def test_plan_60_layers_keeps_the_single_format_decode_batch(share, bf16_slots, nvfp4_slots):
    """E=128, top_k=8, bf16 first/last + NVFP4 (H=7168, I=2048): the engine clamped the server
    to B = 3/6/9 (the bf16 pool's 10/20/30% of 256 experts = 25/51/76 slots); here every pool
    holds a whole layer's E experts, as a single-format model with the same slots does."""
    n = int(share * 60 * 128)
    p = plan_model(128, 8, 7168, 2048, MIXED_60, slots=n, prefill_chunk=2048)
    single = plan_model(128, 8, 7168, 2048, {l: NVFP4 for l in range(60)}, slots=n)
    assert [(q["format"], q["slots"]) for q in p["pools"]] == [("bf16", bf16_slots), ("nvfp4", nvfp4_slots)]
    assert p["decode_batch"] == single["decode_batch"] == -1  # -1: any batch (min(B*8, 128) <= slots)
    assert all(q["decode_batch"] == -1 for q in p["pools"])
    assert p["total_slots"] == n
    bf16, nv = p["pools"]
    assert bf16["expert_bytes"] == 2 * 2048 * 7168 * 2 + 7168 * 2048 * 2  # gate_up + down, bf16
    assert nv["expert_bytes"] == 14680064 + 7340032 + 1835008 + 917504 + 16384 + 28672
    # staging: its own region, 8 bf16 experts a half, the same bytes in NVFP4 experts
    assert (bf16["staging_group"], nv["staging_group"]) == (8, 28)
    assert p["staging_bytes"] == 1_565_949_952  # 1.46 GiB: 2 halves x (8 bf16 | 28 NVFP4 experts) per bank


@pytest.mark.parametrize("share,b", [(0.1, 3), (0.2, 6), (0.3, 9)])
def test_plan_60_layers_with_a_configured_batch(share, b):
    """With the engine's batch limits asked for explicitly, every pool holds min(B*8, 128)
    slots and the rest is split at an equal share of each pool's own experts."""
    n = int(share * 60 * 128)
    p = plan_model(128, 8, 7168, 2048, MIXED_60, slots=n, decode_batch=b)
    bf16, nv = p["pools"]
    assert bf16["slots"] >= 8 * b and nv["slots"] >= 8 * b
    assert bf16["slots"] + nv["slots"] == n
    assert abs(bf16["share"] - nv["share"]) < 0.01 or bf16["slots"] == 8 * b


E32 = {
    "nvfp4": {l: NVFP4 for l in range(12)},
    "bf16 first/last": {l: (BF16 if l in (0, 11) else NVFP4) for l in range(12)},
    "1 nvfp4 in 12": {l: (NVFP4 if l == 6 else BF16) for l in range(12)},
}
E32_H, E32_I = 2048, 1024
E32_SLOTS = {
    "nvfp4": {128: [128], 153: [153], 256: [256]},
    "bf16 first/last": {128: [32, 96], 153: [32, 121], 256: [42, 214]},
    "1 nvfp4 in 12": {128: [96, 32], 153: [121, 32], 256: [224, 32]},
}


@pytest.mark.parametrize("case", list(E32))
@pytest.mark.parametrize("slots", [128, 153, 256])
def test_plan_e32_every_pool_keeps_decode_slots(case, slots):
    """E=32, top_k=2, 12 layers: at 153 slots the engine left bf16 first/last with 0 slots
    outside staging. Here staging is its own region: every pool keeps all E=32 experts of a
    decode layer (any batch), and the slots add up."""
    p = plan_model(32, 2, E32_H, E32_I, E32[case], slots=slots, prefill_chunk=512)
    assert [q["slots"] for q in p["pools"]] == E32_SLOTS[case][slots]  # docs/RUNTIME.md, "Plans"
    assert sum(q["slots"] for q in p["pools"]) == slots
    assert all(q["slots"] >= 32 and q["decode_batch"] == -1 for q in p["pools"])
    assert p["staging_bytes"] > 0 and all(q["staging_group"] >= 8 for q in p["pools"])


def test_plan_refuses_early_with_the_minimum():
    with pytest.raises(CapacityError, match=r"minimum is 64 slots"):
        plan_model(32, 2, E32_H, E32_I, E32["bf16 first/last"], slots=63, decode_batch=16)
    p = plan_model(128, 8, 7168, 2048, MIXED_60, gpu_mem="40GiB", decode_batch=1, prefill_chunk=2048)
    with pytest.raises(CapacityError, match=rf"minimum is .*\({p['min_gpu_mem']} bytes\)"):
        plan_model(128, 8, 7168, 2048, MIXED_60, gpu_mem=p["min_gpu_mem"] - 1, decode_batch=1, prefill_chunk=2048)
    exact = plan_model(128, 8, 7168, 2048, MIXED_60, gpu_mem=p["min_gpu_mem"], decode_batch=1, prefill_chunk=2048)
    assert [q["slots"] for q in exact["pools"]] == [8, 8]
    assert exact["total_bytes"] <= p["min_gpu_mem"]


def test_plan_memory_budget_is_respected_and_regions_do_not_overlap():
    p = plan_model(128, 8, 7168, 2048, MIXED_60, gpu_mem="30GiB", decode_batch=4, prefill_chunk=1024)
    assert p["total_bytes"] <= 30 << 30
    assert p["total_bytes"] > (30 << 30) - 2 * p["pools"][0]["expert_bytes"]  # little left unused
    for k in range(len(p["bank_names"])):
        spans = sorted((q["offset"][k], q["offset"][k] + q["slots"] * q["stride"][k]) for q in p["pools"])
        spans.append((p["staging_offset"][k], p["staging_offset"][k] + 2 * p["staging_half"][k]))
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        assert spans[-1][1] <= p["bank_bytes"][k]


def test_plan_zero_byte_banks_take_no_memory():
    p = plan_model(128, 8, 7168, 2048, MIXED_60, slots=768)
    bf16 = p["pools"][0]
    for k, name in enumerate(p["bank_names"]):
        if name not in ("gate_up", "down"):
            assert bf16["row_bytes"][k] == 0 and bf16["stride"][k] == 0


# -- the pools: a Python reference of the eviction order ------------------------------------


class Reference:
    """Per-pool eviction exactly as documented: LRU by use sequence; LRFU by
    lambda * t_last + log2(C), C = 1 + C_prev * 2^(-lambda * (t - t_prev))."""

    def __init__(self, pools: SlotPools, lam: float | None):
        plan = pools.plan
        self.lam = lam
        self.row = {l: i for i, l in enumerate(l for q in plan["pools"] for l in q["layers"])}
        self.pool = {l: pools.pool_of(l) for l in self.row}
        self.cap = [q["slots"] for q in plan["pools"]]
        self.resident: list[dict] = [{} for _ in self.cap]  # key -> (prio, seq)
        self.crf: dict = {}
        self.tick = 0
        self.seq = 0

    def touch(self, p: int, key) -> None:
        prio = 0.0
        if self.lam is not None:
            c, t = self.crf.get(key, (0.0, 0))
            c = 1.0 + c * math.exp2(-self.lam * (self.tick - t))
            self.crf[key] = (c, self.tick)
            prio = self.lam * self.tick + math.log2(c)
        self.seq += 1
        self.resident[p][key] = (prio, self.seq)

    def request(self, routed: dict[int, list[int]]) -> None:
        keys = sorted({(self.row[l], e) for l, ids in routed.items() for e in ids})
        rowlayer = {v: k for k, v in self.row.items()}
        pinned = {k for k in keys if k in self.resident[self.pool[rowlayer[k[0]]]]}
        for key in keys:
            p = self.pool[rowlayer[key[0]]]
            res = self.resident[p]
            if key in res:
                continue
            if len(res) >= self.cap[p]:
                victim = min((v, k) for k, v in res.items() if k not in pinned)[1]
                del res[victim]
            res[key] = (0.0, 0)
            pinned.add(key)
        for key in keys:
            self.touch(self.pool[rowlayer[key[0]]], key)

    def prefill(self, layer: int, ids) -> None:
        for e in sorted(set(ids)):
            key = (self.row[layer], e)
            p = self.pool[layer]
            if key in self.resident[p]:
                self.touch(p, key)

    def resident_experts(self, layer: int) -> set[int]:
        r = self.row[layer]
        return {e for (row, e) in self.resident[self.pool[layer]] if row == r}


def resident(pools: SlotPools, layer: int) -> set[int]:
    return {e for e in range(E) if pools.slot_of(layer, e) >= 0}


def check_bytes(pools: SlotPools, banks: ExpertBanks) -> int:
    """Every resident expert's rows, read through the view as a kernel would (pointer + slot *
    stride), equal the host rows; the device table equals the host mirror. Returns rows checked."""
    checked = 0
    table = pools.read_table()
    for layer, fmt in banks.layer_formats.items():
        view = pools.view(layer)
        slots = np.ctypeslib.as_array(ctypes.cast(view.slot_of_expert, ctypes.POINTER(ctypes.c_int32)), (E,))
        assert slots.tolist() == [pools.slot_of(layer, e) for e in range(E)]
        row = [l for q in pools.plan["pools"] for l in q["layers"]].index(layer)
        assert table[row * E:(row + 1) * E].tolist() == slots.tolist()
        order = fmt.format.bank_names
        for e in np.flatnonzero(slots >= 0):
            s = int(slots[e])
            for j, name in enumerate(order):
                host = banks.banks[name][layer][e] if name in banks.banks else np.empty(0, np.uint8)
                if host.size == 0:
                    assert view.bank_base[j] == 0 and view.row_bytes[j] == 0
                    continue
                got = ctypes.string_at(view.bank_base[j] + s * view.row_bytes[j], host.nbytes)
                assert got == host.tobytes(), f"layer {layer} expert {e} bank {name} slot {s}"
                assert pools.read_slot(pools.pool_of(layer), name, s) == got
                checked += 1
    return checked


def check_pass(banks: ExpertBanks, layer: int, view, experts) -> None:
    """A prefill pass as its kernel sees it: every listed expert's rows, in every bank of the
    format, at bank_base + slot_of_expert[e] * row_bytes (cache or staging half)."""
    slots = np.ctypeslib.as_array(ctypes.cast(view.slot_of_expert, ctypes.POINTER(ctypes.c_int32)), (E,))
    for e in experts:
        assert slots[e] >= 0
        for j, name in enumerate(banks.layer_formats[layer].format.bank_names):
            host = banks.banks[name][layer][e] if name in banks.banks else np.empty(0, np.uint8)
            if host.nbytes:
                got = ctypes.string_at(view.bank_base[j] + int(slots[e]) * view.row_bytes[j], host.nbytes)
                assert got == host.tobytes(), f"layer {layer} expert {e} bank {name} (half {view.staging_half})"


def random_routing(rng, layers, batch):
    return {l: rng.integers(0, E, (batch, TOP_K)).reshape(-1) for l in layers}


@pytest.mark.parametrize("eviction,lam", [("lru", None), ("lrfu", 0.3), ("lrfu", 0.01)])
def test_eviction_order_matches_the_reference(rng, eviction, lam):
    banks = make_banks(rng)
    pools = SlotPools(banks, slots=44, top_k=TOP_K, decode_batch=2, prefill_chunk=4, eviction=eviction,
                      lam=lam if lam is not None else 0.05)
    ref = Reference(pools, lam)
    # a skewed trace so that eviction order matters
    p = 1.0 / np.arange(1, E + 1) ** 1.2
    p /= p.sum()
    for step in range(300):
        if step % 7 == 3:
            layer = int(rng.choice(list(LAYERS)))
            ids = rng.choice(E, 6, p=p)
            ref.tick += 1
            pools.prefill_step({layer: ids})
            ref.prefill(layer, ids)
        else:
            layers = sorted(rng.choice(list(LAYERS), int(rng.integers(1, 4)), replace=False).tolist())
            routed = {l: rng.choice(E, (2 * TOP_K,), p=p) for l in layers}
            ref.tick += 1
            pools.decode_step(routed)
            ref.request(routed)
        for l in LAYERS:
            assert resident(pools, l) == ref.resident_experts(l), f"step {step} layer {l}"


def test_lru_evicts_the_least_recent_within_its_own_pool(rng):
    banks = make_banks(rng)
    pools = SlotPools(banks, slots=44, top_k=TOP_K, decode_batch=2)
    nv = pools.pool_of(1)
    cap = pools.plan["pools"][nv]["slots"]
    order = [(1 + i % 3, i // 3) for i in range(cap)]  # fill the NVFP4 pool over its 3 layers
    for layer, e in order:
        pools.decode_step({layer: [e]})
    assert pools.stats()["nvfp4"]["evictions"] == 0
    pools.decode_step({order[0][0]: [order[0][1]]})  # the oldest becomes the newest
    pools.decode_step({1: [15]})  # a miss: evicts the least recent, order[1]
    assert pools.slot_of(*order[1]) == -1
    assert pools.slot_of(*order[0]) >= 0 and pools.slot_of(1, 15) >= 0
    assert pools.stats()["nvfp4"]["evictions"] == 1


def test_no_pool_is_touched_by_another_formats_misses(rng):
    banks = make_banks(rng)
    pools = SlotPools(banks, slots=44, top_k=TOP_K, decode_batch=2, prefill_chunk=4)
    for l in LAYERS:
        pools.decode_step({l: list(range(4))})
    before = {l: [pools.slot_of(l, e) for e in range(E)] for l in LAYERS}
    bf16 = pools.pool_of(0)
    bytes_before = {(l, e): pools.read_slot(bf16, "gate_up", pools.slot_of(l, e)) for l in (0, 7) for e in range(4)}
    stats_before = pools.stats()
    for step in range(200):  # hammer the NVFP4 and FP8 pools with misses
        pools.decode_step({l: rng.integers(0, E, 4) for l in (1, 2, 3, 4, 5, 6)})
    for l in (0, 7):
        assert [pools.slot_of(l, e) for e in range(E)] == before[l]
    for (l, e), b in bytes_before.items():
        assert pools.read_slot(bf16, "gate_up", pools.slot_of(l, e)) == b
    assert pools.stats()["bf16"] == stats_before["bf16"]
    assert pools.stats()["nvfp4"]["evictions"] > 0
    check_bytes(pools, banks)


def test_staging_never_evicts_decode_slots(rng):
    banks = make_banks(rng)
    pools = SlotPools(banks, slots=44, top_k=TOP_K, decode_batch=2, prefill_chunk=64)
    for l in LAYERS:
        pools.decode_step({l: [0, 1, 2, 3]})
    before = {l: [pools.slot_of(l, e) for e in range(E)] for l in LAYERS}
    seen: dict[int, list[int]] = {}

    def compute(layer, view, experts):
        # a staged pass: the view's table maps exactly this group to staging rows holding
        # the host bytes; a cache pass: the resident experts
        slots = np.ctypeslib.as_array(ctypes.cast(view.slot_of_expert, ctypes.POINTER(ctypes.c_int32)), (E,))
        for e in experts:
            s = int(slots[e])
            assert s >= 0
            got = ctypes.string_at(view.bank_base[0] + s * view.row_bytes[0], banks.banks["gate_up"][layer][e].nbytes)
            assert got == banks.banks["gate_up"][layer][e].tobytes()
        seen.setdefault(layer, []).extend(experts)

    pools.prefill_step({l: np.arange(E) for l in LAYERS}, compute)
    for l in LAYERS:
        assert sorted(seen[l]) == list(range(E))  # each expert computed once per chunk
        assert [pools.slot_of(l, e) for e in range(E)] == before[l]  # nothing evicted or added
    st = pools.stats()
    assert all(s["evictions"] == 0 for s in st.values())
    assert st["nvfp4"]["staged"] == 3 * (E - 4)  # each missing expert copied once
    check_bytes(pools, banks)


def test_zero_byte_banks_copy_nothing(rng):
    banks = make_banks(rng)
    pools = SlotPools(banks, slots=44, top_k=TOP_K, decode_batch=2)
    pools.decode_step({0: [0, 1, 2], 7: [5]})  # bf16 layers only: 4 misses
    st = pools.stats()["bf16"]
    assert st["misses"] == 4
    assert st["copy_ops"] == 4 * 2  # gate_up and down; the four scale/global banks make none
    rows = format_row_bytes(BF16, H, I)
    assert st["copy_bytes"] == 4 * (rows["gate_up"] + rows["down"])
    assert all(s["copy_ops"] == 0 for k, s in pools.stats().items() if k != "bf16")
    assert pools.last_batch_calls == 1  # one batch for the whole step
    bf16 = pools.plan["pools"][pools.pool_of(0)]
    for k, name in enumerate(pools.bank_names):
        if name not in ("gate_up", "down"):
            assert bf16["stride"][k] == 0
            assert pools.view(0).bank_base[list(BF16.format.bank_names).index("gate_up")] != 0


def test_long_random_sequence_keeps_slots_bit_equal(rng):
    banks = make_banks(rng)
    pools = SlotPools(banks, slots=40, top_k=TOP_K, decode_batch=4, prefill_chunk=3, staging_experts=2,
                      eviction="lrfu")
    checked = 0
    for step in range(400):
        if rng.random() < 0.2:
            routed = {int(l): rng.integers(0, E, (3, TOP_K)).reshape(-1) for l in rng.choice(list(LAYERS), 3, replace=False)}
            pools.prefill_step(routed, lambda layer, view, experts: check_pass(banks, layer, view, experts))
        else:
            pools.decode_step(random_routing(rng, rng.choice(list(LAYERS), 2, replace=False).tolist(), 4))
        if step % 50 == 49:
            checked += check_bytes(pools, banks)
    checked += check_bytes(pools, banks)
    st = pools.stats()
    assert all(s["hits"] and s["misses"] and s["evictions"] for s in st.values()), st
    assert all(s["staged"] for s in st.values()), st
    assert checked > 500


def test_capacity_smaller_than_a_step_is_refused_or_chunked(rng):
    banks = make_banks(rng)
    pools = SlotPools(banks, slots=44, top_k=TOP_K, decode_batch=2)
    fp8_32 = pools.plan["pools"][pools.pool_of(6)]
    cap = fp8_32["slots"]
    pools.decode_step({6: [0]})
    before = [pools.slot_of(6, e) for e in range(E)]
    with pytest.raises(CapacityError, match=r"needs \d+ distinct experts at once in pool fp8_block"):
        pools.request(6, list(range(cap + 1)))
    assert [pools.slot_of(6, e) for e in range(E)] == before  # refused before anything changed
    # several layers of one pool that together exceed it go out as consecutive batches
    nv_cap = pools.plan["pools"][pools.pool_of(1)]["slots"]
    per = nv_cap // 2 + 1
    out = pools.decode_step({1: np.arange(per), 2: np.arange(per)})
    assert [len(out[1]), len(out[2])] == [per, per]
    assert all(pools.slot_of(2, e) >= 0 for e in range(per))
    check_bytes(pools, banks)


def test_a_layer_with_no_routed_experts_copies_nothing(rng):
    pools = SlotPools(make_banks(rng), slots=44, top_k=TOP_K, decode_batch=2)
    out = pools.decode_step({1: [], 2: [3]})
    assert out[1].size == 0 and out[2].tolist() == [pools.slot_of(2, 3)]
    assert resident(pools, 1) == set() and pools.stats()["nvfp4"]["misses"] == 1


def test_bad_input_is_one_clear_error(rng):
    banks = make_banks(rng)
    pools = SlotPools(banks, slots=44, top_k=TOP_K, decode_batch=2)
    with pytest.raises(FormatError, match="expert id 16 of layer 1 outside 0..15"):
        pools.request(1, [16])
    with pytest.raises(FormatError, match="layer 9 is in no pool"):
        pools.request(9, [0])
    banks.banks["down"][3] = banks.banks["down"][3][:, :-1].copy()
    with pytest.raises(FormatError, match="bank down of layer 3"):
        SlotPools(banks, slots=44, top_k=TOP_K, decode_batch=2)
    with pytest.raises(CapacityError, match="minimum is"):
        SlotPools(make_banks(rng), slots=10, top_k=TOP_K, decode_batch=2)


# -- a real file: the loader's banks, `ftw plan` -------------------------------------------


def test_pools_over_a_loaded_file(tmp_path, rng):
    import ftw
    import helpers_container as hc

    path = tmp_path / "m.ftw"
    hc.write_sample(path, rng)
    banks = ftw.load_expert_banks(path)
    pools = SlotPools(banks, slots=2 * hc.E, decode_batch=1)  # top_k from the file's model
    assert [q["format"] for q in pools.plan["pools"]] == ["bf16", "nvfp4"]
    nv = pools.plan["pools"][1]
    for k, name in enumerate(pools.bank_names):  # the bias banks are bf16's alone
        assert (nv["row_bytes"][k] == 0) == (name in ("gate_up_bias", "down_bias"))
    for step in range(30):
        pools.decode_step({1: rng.integers(0, hc.E, 2), 3: rng.integers(0, hc.E, 2)})
    assert check_bytes_loaded(pools, banks) > 0


def check_bytes_loaded(pools, banks) -> int:
    n = 0
    for layer, fmt in banks.layer_formats.items():
        view = pools.view(layer)
        for e in range(banks.num_experts):
            s = pools.slot_of(layer, e)
            if s < 0:
                continue
            for j, name in enumerate(fmt.format.bank_names):
                host = banks.banks[name][layer][e] if name in banks.banks else np.empty(0)
                if host.nbytes == 0:
                    assert view.bank_base[j] == 0
                    continue
                assert ctypes.string_at(view.bank_base[j] + s * view.row_bytes[j], host.nbytes) == host.tobytes()
                n += 1
    return n


def test_plan_command(tmp_path, rng):
    import json

    from click.testing import CliRunner

    import helpers_container as hc
    from ftw.cli import cli

    path = tmp_path / "m.ftw"
    hc.write_sample(path, rng)
    r = CliRunner().invoke(cli, ["plan", str(path), "--slots", "50%", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert [q["slots"] for q in p["pools"]] == [hc.E // 2, hc.E // 2]  # 50% of 2 layers x E, equal shares
    assert p["top_k"] == 2
    flags = ["--experts", "128", "--hidden", "7168", "--intermediate", "2048", "--top-k", "8", "--layers", "60",
             "--format", "nvfp4", "--format", "bf16:0,59"]
    r = CliRunner().invoke(cli, ["plan", *flags, "--slots", "10%", "--json"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert [(q["format"], q["slots"], q["decode_batch"]) for q in p["pools"]] == [("bf16", 128, -1), ("nvfp4", 640, -1)]
    r = CliRunner().invoke(cli, ["plan", *flags, "--gpu-mem", "40GiB"])
    assert r.exit_code == 0 and "nvfp4" in r.output and "staging" in r.output
    r = CliRunner().invoke(cli, ["plan", *flags, "--gpu-mem", "1GiB"])
    assert r.exit_code != 0 and "minimum is" in str(r.exception)
    no_default = [f for f in flags if f != "nvfp4"]
    no_default.remove("--format")
    r = CliRunner().invoke(cli, ["plan", *no_default, "--slots", "10%"])
    assert "layer 1 has no format" in str(r.exception)
