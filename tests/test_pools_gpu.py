"""Slot pools on a CUDA device (skipped where there is none: CI has no GPU).

The same random sequence of decode and prefill steps drives the host twin and the CUDA
backend; the resident sets must agree step by step and every resident slot and staged row on
the device must be bit-equal to the host banks. Rows of >= 256 KiB take the cudaMemcpyBatchAsync
path, smaller ones the copy kernel, unaligned ones its byte loop."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

from ftw.formats import LayerFormat  # noqa: E402
from ftw.loader import ExpertBanks  # noqa: E402
from ftw.runtime import build_info  # noqa: E402
from ftw.runtime.pools import CapacityError, SlotPools  # noqa: E402

if not build_info().get("cuda"):
    pytest.skip("ftw._runtime was built without CUDA", allow_module_level=True)

E, TOP_K = 16, 2
BF16, NVFP4 = LayerFormat.of("bf16"), LayerFormat.of("nvfp4")
# bytes per row: bf16 rows on the batch-call path (>= 256 KiB), NVFP4 rows on the kernel path,
# and the small odd sizes (not multiples of 16) on the kernel's byte loop
ROWS = {
    BF16: {"gate_up": 512 << 10, "down": 256 << 10},
    NVFP4: {"gate_up": 64 << 10, "down": 32 << 10, "gate_up_scale": 4100, "down_scale": 2051,
            "gate_up_global": 1024, "down_global": 777},
}
LAYERS = {0: BF16, 1: NVFP4, 2: NVFP4, 3: NVFP4, 4: BF16}


def make_banks(seed: int, pinned: bool) -> ExpertBanks:
    rng = np.random.default_rng(seed)
    names = sorted({b for r in ROWS.values() for b in r})
    banks: dict = {n: {} for n in names}
    for layer, fmt in LAYERS.items():
        for n in names:
            nb = ROWS[fmt].get(n, 0)
            a = torch.from_numpy(rng.integers(0, 256, (E, nb), dtype=np.uint8))
            banks[n][layer] = a.pin_memory() if pinned and nb else a
    return ExpertBanks(banks, dict(LAYERS), E)


def host_row(banks, name, layer, e) -> bytes:
    return banks.banks[name][layer][e].numpy().tobytes()


def check_device(pools: SlotPools, banks: ExpertBanks) -> int:
    n = 0
    table = pools.read_table()
    rows = [l for q in pools.plan["pools"] for l in q["layers"]]
    for layer in LAYERS:
        r = rows.index(layer)
        mirror = [pools.slot_of(layer, e) for e in range(E)]
        assert table[r * E:(r + 1) * E].tolist() == mirror
        for e, s in enumerate(mirror):
            if s < 0:
                continue
            for name in pools.bank_names:
                if banks.banks[name][layer].shape[1]:
                    assert pools.read_slot(pools.pool_of(layer), name, s) == host_row(banks, name, layer, e), \
                        f"layer {layer} expert {e} bank {name} slot {s}"
                    n += 1
    return n


def run_sequence(pools: SlotPools, banks: ExpertBanks, seed: int, steps: int, check_staging: bool):
    rng = np.random.default_rng(seed)
    history = []

    def compute(layer, view, experts):
        if not check_staging or view.staging_half < 0:
            return  # a cache pass: checked with the slots
        pools.sync()
        for i, e in enumerate(experts):
            for name in pools.bank_names:
                if banks.banks[name][layer].shape[1]:
                    got = pools.read_staging(view.staging_half, pools.pool_of(layer), name, i)
                    assert got == host_row(banks, name, layer, e), f"staged expert {e} of layer {layer} bank {name}"

    for step in range(steps):
        if rng.random() < 0.25:
            routed = {int(l): rng.integers(0, E, 3 * TOP_K) for l in rng.choice(list(LAYERS), 2, replace=False)}
            pools.prefill_step(routed, compute)
        else:
            routed = {int(l): rng.integers(0, E, 2 * TOP_K) for l in rng.choice(list(LAYERS), 2, replace=False)}
            pools.decode_step(routed)
        history.append({l: frozenset(e for e in range(E) if pools.slot_of(l, e) >= 0) for l in LAYERS})
    return history


@pytest.mark.parametrize("eviction", ["lru", "lrfu"])
def test_cuda_pools_match_the_host_twin_bit_for_bit(eviction):
    kw = dict(slots=24, top_k=TOP_K, decode_batch=2, prefill_chunk=2, staging_experts=3, eviction=eviction)
    host_banks, dev_banks = make_banks(7, pinned=False), make_banks(7, pinned=True)
    host = SlotPools(host_banks, backend="host", **kw)
    dev = SlotPools(dev_banks, backend="cuda", stream=torch.cuda.current_stream().cuda_stream, **kw)
    assert host.plan == dev.plan
    h = run_sequence(host, host_banks, 11, 300, check_staging=False)
    d = run_sequence(dev, dev_banks, 11, 300, check_staging=True)
    assert h == d
    torch.cuda.synchronize()
    assert check_device(dev, dev_banks) > 50
    st = dev.stats()
    assert st == host.stats()
    assert all(s["misses"] and s["evictions"] and s["staged"] for s in st.values()), st


def test_cuda_batch_call_and_kernel_split_by_row_size():
    banks = make_banks(3, pinned=True)
    pools = SlotPools(banks, slots=24, top_k=TOP_K, decode_batch=2, backend="cuda")
    pools.decode_step({0: [1, 2]})  # bf16 only: rows >= 256 KiB + table rows
    assert (pools.last_batch_calls, pools.last_kernel_calls) == (1, 1)
    pools.decode_step({1: [1, 2]})  # NVFP4 only: every row below 256 KiB
    assert (pools.last_batch_calls, pools.last_kernel_calls) == (0, 1)
    pools.decode_step({0: [1, 2], 1: [1, 2]})  # all hits: nothing launched
    assert (pools.last_batch_calls, pools.last_kernel_calls) == (0, 0)
    pools._p.set_timing(True)  # noqa: SLF001 (the bench's device timing of a batch)
    pools.decode_step({0: [3], 1: [3]})
    pools.sync()
    assert 0 < pools._p.last_copy_ms < 1000  # noqa: SLF001
    torch.cuda.synchronize()
    assert check_device(pools, banks) == 3 * 2 + 3 * 6  # experts 1-3 of a bf16 and an NVFP4 layer


def test_cuda_capacity_smaller_than_a_step_is_refused_and_corrupts_nothing():
    banks = make_banks(5, pinned=True)
    pools = SlotPools(banks, slots=24, top_k=TOP_K, decode_batch=2, backend="cuda")
    cap = pools.plan["pools"][pools.pool_of(0)]["slots"]
    pools.decode_step({0: [0, 1, 2]})
    with pytest.raises(CapacityError):
        pools.request(0, list(range(cap + 1)))
    out = pools.decode_step({0: np.arange(cap // 2 + 1), 4: np.arange(cap // 2 + 1)})  # chunked by layer
    assert len(out[0]) == len(out[4]) == cap // 2 + 1
    torch.cuda.synchronize()
    check_device(pools, banks)


def test_cuda_refuses_pageable_host_rows():
    from ftw.errors import FormatError

    with pytest.raises(FormatError, match="not page-locked"):
        SlotPools(make_banks(1, pinned=False), slots=24, top_k=TOP_K, decode_batch=2, backend="cuda")


def test_cuda_pools_over_pinned_loaded_banks(tmp_path):
    """ftw.load_expert_banks(pin=True) page-locks with cudaHostRegister: the kernel reads it."""
    import ftw
    import helpers_container as hc

    path = tmp_path / "m.ftw"
    hc.write_sample(path, np.random.default_rng(2))
    banks = ftw.load_expert_banks(path, pin=True)
    assert banks.pinned
    pools = SlotPools(banks, slots=2 * hc.E, decode_batch=1, backend="cuda")
    for step in range(20):
        pools.decode_step({1: [step % hc.E, (step * 3) % hc.E], 3: [(step * 5) % hc.E]})
    torch.cuda.synchronize()
    n = 0
    for layer in (1, 3):
        for e in range(hc.E):
            s = pools.slot_of(layer, e)
            if s < 0:
                continue
            for name, per_layer in banks.banks.items():
                t = per_layer[layer]
                if t.numel():
                    want = t[e].contiguous().view(torch.uint8).numpy().tobytes()
                    assert pools.read_slot(pools.pool_of(layer), name, s) == want
                    n += 1
    assert n > 0
