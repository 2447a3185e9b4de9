"""Pinned loading on a real CUDA device (skipped where there is none: CI has no GPU).

The CPU side of pinning (page-aligned buffers, torch views of the right dtype and bytes) is
tested in test_loader.py; only page-locking itself needs the device."""

from __future__ import annotations

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

import ftw  # noqa: E402
from ftw import pinned  # noqa: E402
from ftw.banks import BankSource, LayerBanks  # noqa: E402
from ftw.formats import LayerFormat  # noqa: E402
from ftw.writers import FtwWriter  # noqa: E402


def test_pinned_banks_are_page_locked_and_copy_to_the_device(tmp_path, monkeypatch):
    rng = np.random.default_rng()
    E, H, I = 8, 256, 128
    gu = rng.integers(1, 0xFFFF, (E, 2 * I, H), dtype=np.uint16)
    sc = rng.integers(1, 0x7E, (E, H, I // 16), dtype=np.uint8)
    path = tmp_path / "p.ftw"
    with FtwWriter(path) as w:
        w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {
            "gate_up": BankSource("bf16", (2 * I, H), E, lambda e: [gu[e]]),
            "down": BankSource("bf16", (H, I), E, lambda e: [gu[e, :H // 2].reshape(H, I)]),
        }))
        w.add_layer(LayerBanks(1, LayerFormat.of("nvfp4"), {
            n: BankSource(dt, shape, E, lambda e, a=a: [a[e]]) for n, dt, shape, a in (
                ("gate_up", "u8", (2 * I, H // 2), gu.view(np.uint8)[:, :, :H // 2]),
                ("down", "u8", (H, I // 2), gu.view(np.uint8)[:, :H, :I // 2]),
                ("gate_up_scale", "f8_e4m3", (2 * I, H // 16), gu.view(np.uint8)[:, :, :H // 16]),
                ("down_scale", "f8_e4m3", (H, I // 16), sc),
                ("gate_up_global", "f32", (2 * I,), rng.random((E, 2 * I), dtype=np.float32)),
                ("down_global", "f32", (H,), rng.random((E, H), dtype=np.float32)),
            )
        }))
    unregistered = []
    real = pinned._unregister
    monkeypatch.setattr(pinned, "_unregister", lambda ptr: (unregistered.append(ptr), real(ptr)))

    eb = ftw.load_expert_banks(path, pin=True, threads=4)
    assert eb.pinned
    t = eb.banks["gate_up"][0]
    assert t.dtype == torch.bfloat16 and t.is_pinned()
    dev = t.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert np.array_equal(dev.view(torch.int16).cpu().numpy().view(np.uint16), gu)
    assert eb.banks["down_scale"][1].dtype == torch.float8_e4m3fn and eb.banks["down_scale"][1].is_pinned()
    assert np.array_equal(eb.banks["down_scale"][1].view(torch.uint8).numpy(), sc)
    assert eb.banks["gate_up_scale"][0].shape == (E, 0)  # placeholders: nothing to lock
    locked = sum(1 for per in eb.banks.values() for a in per.values() if a.numel())
    del eb, t, dev
    gc.collect()
    assert len(unregistered) == locked  # every bank's pages unlocked once its tensor died
