"""FileMap views: the file and offset behind a view, found without reading it."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ftw.mapped import FileMap, file_span


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
    fm, offset = file_span(rows[3])
    assert fm is mm and offset == 100 + 3 * rows.shape[1] * 2
    assert os.pread(fm.source_fd, rows[3].nbytes, offset) == data[offset:offset + rows[3].nbytes].tobytes()
    assert file_span(memoryview(np.ascontiguousarray(rows[5])).cast("B"))[1] == 100 + 5 * rows.shape[1] * 2
    assert file_span(rows[:, ::2]) is None  # strided: not one byte range
    assert file_span(rows.T) is None
    assert file_span(rows[3].copy()) is None  # a copy is not the file's bytes
    assert file_span(np.ones(10)) is None
