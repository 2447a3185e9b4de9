"""`ftw check --runtime`: random tokens through the CPU executor against a float64 MoE from the
source's own tensors; the GPU runtime refuses clearly where there is none."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from checking import check

from ftw.errors import UnsupportedError
from ftw.runtime import CpuMoeExecutor, cuda_device_count
from ftw.writers.convert import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = ["st/mixed_bf16_nvfp4", "st/mixed_fp8_nvfp4", "st/mixed_gpt_oss_mxfp4_bf16", "st/deepseek_v4_fp4",
           "gguf/qwen3moe-UD-IQ2_XS.gguf", "gguf/deepseek2-mixed-gate-up.gguf"]


@pytest.mark.parametrize("sample", SAMPLES)
def test_runtime_cpu_passes_every_layer_within_tolerance(tmp_path, sample):
    src = os.path.join(ROOT, "samples", sample)
    dst = tmp_path / "m.ftw"
    convert(src, dst)
    report = check(src, dst, runtime="cpu", seed=1)
    assert report.ok, report.all_problems()
    for r in report.layers.values():
        assert r.runtime["run"] and r.runtime["tokens"] > 0
        assert r.runtime["max_rel_err"] < 1e-5  # float32 accumulation of float32 hidden states


def test_runtime_cpu_catches_an_executor_that_is_slightly_wrong(tmp_path, monkeypatch):
    src = os.path.join(ROOT, "samples", "st", "mixed_bf16_nvfp4")
    dst = tmp_path / "m.ftw"
    convert(src, dst)
    real = CpuMoeExecutor.forward

    def off_by_a_little(self, layer, hidden, ids, w):
        out = np.array(real(self, layer, hidden, ids, w))
        return out * (1 + 1e-3) if layer == 2 else out

    monkeypatch.setattr(CpuMoeExecutor, "forward", off_by_a_little)
    report = check(src, dst, runtime="cpu")
    assert not report.ok
    assert [r.layer for r in report.layers.values() if not r.ok] == [2]
    assert "cpu executor: relative error" in report.layers[2].problems[0]


@pytest.mark.skipif(cuda_device_count() > 0, reason="the GPU machine runs the CUDA round trip instead")
def test_runtime_cuda_without_a_gpu_is_one_clear_error(tmp_path):
    src = os.path.join(ROOT, "samples", "st", "mixed_bf16_nvfp4")
    dst = tmp_path / "m.ftw"
    convert(src, dst)
    with pytest.raises(UnsupportedError, match="runtime cuda"):
        check(src, dst, runtime="cuda")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "cli.py"), "check", src, str(dst), "--runtime", "cuda"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1
    report = check(src, dst, runtime="auto")  # no GPU here: the CPU
    assert report.runtime == "cpu" and report.ok
