"""The converter's data path: every source byte of a bank or tensor is read once, with pread,
in requests of at most one chunk, runs of adjacent bytes in file order; nothing is read
through the memory maps; and the output is the source's bytes (its checksums verify)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ftw
from ftw.readers import open_checkpoint
from ftw.writers import ftw_writer
from ftw.writers.convert import plan_conversion, write_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "samples")
# every bank of these is a view of the source (no computed rows)
VIEW_ONLY = ["st/qwen3_moe_bf16", "st/qwen3_moe_bf16_stacked", "st/deepseek_v3_fp8", "gguf/qwen3moe-Q4_K_M.gguf"]


def _path_of(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def reads(monkeypatch):
    """Every os.preadv of this process as (file, offset, nbytes)."""
    seen: list[tuple[str, int, int]] = []
    real = os.preadv

    def preadv(fd, buffers, offset, *a):
        n = real(fd, buffers, offset, *a)
        seen.append((_path_of(fd), offset, n))
        return n

    monkeypatch.setattr(os, "preadv", preadv)
    return seen


def _mapped_rss_kib(paths: list[str]) -> int:
    """Resident KiB of this process's mappings of the given files (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                inside = line.rstrip("\n").endswith(tuple(paths))
            elif inside and first == "Rss:":
                total += int(line.split()[1])
    return total


@pytest.mark.parametrize("sample", VIEW_ONLY)
def test_each_source_byte_is_read_once_with_pread_and_never_through_the_map(tmp_path, sample, reads, monkeypatch):
    src = os.path.join(SAMPLES, sample)
    dst = tmp_path / "out.ftw"
    with open_checkpoint(src) as reader:
        monkeypatch.setattr(reader, "release_pages", lambda: None)  # keep whatever the map brought in
        plan = plan_conversion(reader)
        write_plan(plan, reader, dst)
        files = [p for p in reader.source_files() if p.endswith((".safetensors", ".gguf"))]
        resident = _mapped_rss_kib([os.path.realpath(p) for p in files])
    assert resident == 0  # not one page of a source touched through its map

    data_reads = [r for r in reads if r[0] in {os.path.realpath(p) for p in files}]
    assert sum(n for _, _, n in data_reads) == plan.expert_nbytes + plan.tensor_nbytes
    assert all(0 < n <= ftw_writer.CHUNK for _, _, n in data_reads)
    for path in {p for p, _, _ in data_reads}:  # no byte read twice
        spans = sorted((o, o + n) for p, o, n in data_reads if p == path)
        assert all(a_end <= b for (_, a_end), (b, _) in zip(spans, spans[1:]))

    with ftw.open(dst) as f:
        f.verify()
        for lb in plan.layers:  # the stored rows are the source's bytes
            for name, bank in lb.banks.items():
                stored = f.bank(lb.layer, name)
                for e in (0, bank.num_experts - 1):
                    assert stored[e].tobytes() == bank.row_array(e).tobytes()


def test_adjacent_rows_are_read_as_one_sequential_run(tmp_path, reads):
    """A GGUF bank is [E, ...] in the source: its experts are read front to back, each
    request starting where the previous ended, not one request per expert."""
    src = os.path.join(SAMPLES, "gguf", "qwen3moe-Q4_K_M.gguf")
    with open_checkpoint(src) as reader:
        plan = plan_conversion(reader)
        write_plan(plan, reader, tmp_path / "out.ftw")
    data = [(o, n) for p, o, n in reads if p == os.path.realpath(src)]
    breaks = sum(1 for (o1, n1), (o2, _) in zip(data, data[1:]) if o1 + n1 != o2)
    pieces = sum(len(lb.banks) for lb in plan.layers) + len(plan.tensors)
    assert breaks < pieces  # at most one jump per bank or tensor, never per expert
    assert len(data) <= pieces + sum(-(-lb.nbytes // ftw_writer.CHUNK) for lb in plan.layers) + len(plan.tensors)


def test_computed_rows_and_views_mix_in_one_blob(tmp_path):
    """NVFP4 banks are views, their globals are computed arrays: the blob of each is hashed in
    order across both kinds of chunk (verify passes, bytes equal the reader's rows)."""
    src = os.path.join(SAMPLES, "st", "mixed_bf16_nvfp4")
    dst = tmp_path / "out.ftw"
    with open_checkpoint(src) as reader:
        plan = plan_conversion(reader)
        write_plan(plan, reader, dst)
        with ftw.open(dst) as f:
            assert f.verify() > 0
            for lb in plan.layers:
                for name, bank in lb.banks.items():
                    stored = f.bank(lb.layer, name)
                    want = np.stack([bank.row_array(e) for e in range(bank.num_experts)])
                    assert stored.tobytes() == want.tobytes(), (lb.layer, name)


def test_a_failed_write_names_the_destination(tmp_path, monkeypatch):
    from ftw.errors import FtwError

    def full(fd, data, offset):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    dst = tmp_path / "out.ftw"
    with pytest.raises(FtwError, match=f"{dst}: cannot write: No space left on device"):
        with open_checkpoint(os.path.join(SAMPLES, "st", "qwen3_moe_bf16")) as reader:
            write_plan(plan_conversion(reader), reader, dst)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("shape", [(1, 1), (3, 200), (130, 7), (2048, 96)])
@pytest.mark.parametrize("step", [1, 2])
def test_transposed_is_numpys_transpose(shape, step):
    from ftw.readers.rows import transposed

    rng = np.random.default_rng()
    a = rng.integers(0, 1 << 16, (shape[0], shape[1] * step), dtype=np.uint16)[:, ::step]
    got = transposed(a)
    assert got.flags.c_contiguous and got.dtype == a.dtype
    np.testing.assert_array_equal(got, a.T)


def test_slab_reads_an_entry_with_pread_and_names_a_shard_cut_short(tmp_path, reads):
    import shutil

    from ftw.errors import SourceError
    from ftw.readers.safetensors_index import SafetensorsIndex

    src = tmp_path / "src"
    shutil.copytree(os.path.join(SAMPLES, "st", "qwen3_moe_bf16_stacked"), src)
    index = SafetensorsIndex(str(src))
    name = next(n for n in index.names() if n.endswith("experts.gate_up_proj"))
    E = index.info(name).shape[0]
    for e in (0, E - 1):
        np.testing.assert_array_equal(index.slab(name, e), index.array(name)[e])
    assert any(n == index.info(name).nbytes // E for _, _, n in reads)
    with pytest.raises(SourceError, match="no entry"):
        index.slab(name, E)
    os.truncate(index.info(name).shard, index.info(name).offset + 10)
    with pytest.raises(SourceError, match=f"{index.info(name).shard}.*shrank"):
        index.slab(name, E - 1)
    index.close()


def test_a_filesystem_that_refuses_direct_writes_gets_plain_ones(tmp_path, monkeypatch):
    """tmpfs on older kernels and some FUSE mounts take O_DIRECT and then refuse the write
    (EINVAL): the same buffers go out with plain writes, and the file is the same."""
    import fcntl

    from ftw.writers import sink

    real = os.pwrite
    refused = []

    def pwrite(fd, data, offset):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & sink.O_DIRECT:
            refused.append(offset)
            raise OSError(22, "Invalid argument")
        return real(fd, data, offset)

    src = os.path.join(SAMPLES, "st", "mixed_bf16_nvfp4")
    with open_checkpoint(src) as reader:
        write_plan(plan_conversion(reader), reader, tmp_path / "a.ftw")
    monkeypatch.setattr(os, "pwrite", pwrite)
    with open_checkpoint(src) as reader:
        write_plan(plan_conversion(reader), reader, tmp_path / "b.ftw")
    assert refused  # the direct write was tried, refused, and redone plainly
    assert (tmp_path / "a.ftw").read_bytes() == (tmp_path / "b.ftw").read_bytes()
    with ftw.open(tmp_path / "b.ftw") as f:
        f.verify()
