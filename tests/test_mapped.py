"""FileMap views and the writer's in-kernel copy of them (and its fallbacks)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ftw
from checking import check
from ftw.mapped import FileMap, file_span
from ftw.writers.convert import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "samples", "st", "mixed_bf16_nvfp4")


@pytest.fixture
def mapped_file(tmp_path):
    data = np.random.default_rng().integers(1, 255, 3 * 4096 + 100, dtype=np.uint8)
    path = tmp_path / "f.bin"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    mm = FileMap(fd)
    os.close(fd)  # the map keeps its own descriptor
    yield mm, data


def test_file_span_finds_the_bytes_a_view_shows(mapped_file):
    mm, data = mapped_file
    whole = np.frombuffer(mm, dtype=np.uint8)
    rows = whole[100:100 + 4096 * 2].view(np.uint16).reshape(64, -1)
    fd, offset = file_span(rows[3])
    assert offset == 100 + 3 * rows.shape[1] * 2
    assert os.pread(fd, rows[3].nbytes, offset) == data[offset:offset + rows[3].nbytes].tobytes()
    assert file_span(memoryview(np.ascontiguousarray(rows[5])).cast("B"))[1] == 100 + 5 * rows.shape[1] * 2
    assert file_span(rows[:, ::2]) is None  # strided: not one byte range
    assert file_span(rows.T) is None
    assert file_span(rows[3].copy()) is None  # a copy is not the file's bytes
    assert file_span(np.ones(10)) is None


def test_convert_falls_back_to_write_when_the_kernel_cannot_copy(tmp_path, monkeypatch):
    def refuse(*a):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    dst = tmp_path / "w.ftw"
    convert(SAMPLE, dst)
    assert check(SAMPLE, dst).ok


def test_convert_finishes_a_partial_kernel_copy_with_write(tmp_path, monkeypatch):
    real = os.copy_file_range
    calls = []

    def half(src, dst, count, offset_src=None, offset_dst=None):
        calls.append(count)
        if len(calls) % 2:  # every other call copies half, then fails: write() finishes the row
            return real(src, dst, max(1, count // 2), offset_src)
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "copy_file_range", half)
    dst = tmp_path / "p.ftw"
    convert(SAMPLE, dst)
    assert calls and check(SAMPLE, dst).ok
    with ftw.open(dst) as f:
        f.verify()
