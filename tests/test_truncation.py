"""A source or an FTW file cut short while ftw reads it: one FtwError naming the file, never a
SIGBUS, and nothing left at the destination. Each case runs in a child process, so that a
signal death shows as that (a negative return code) instead of killing the test run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "samples")

# (sample, file to cut): per-expert views, stacked and transposed rows (gpt-oss reads its
# rows through the map), quantized per-expert with computed globals, and a GGUF
CASES = [
    ("st/qwen3_moe_bf16", "model.safetensors"),
    ("st/gpt_oss_bf16", "model.safetensors"),
    ("st/mixed_bf16_nvfp4", "model.safetensors"),
    ("st/qwen3_moe_bf16_stacked", "model.safetensors"),
    ("gguf/qwen3moe-Q4_K_M.gguf", None),
]

CONVERT_AND_CUT = """
import os, sys
from ftw.errors import FtwError
from ftw.writers.convert import convert
src, cut, dst, keep = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def progress(n=0, layers=0):
    if layers:  # the first layer is written: cut the source short under the converter
        os.truncate(cut, keep)

try:
    convert(src, dst, progress=progress, compress_level={level})
except FtwError as e:
    print(type(e).__name__, e)
    sys.exit(3)
print("converted")
"""


def run_child(code: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def header_end(path: str) -> int:
    """Bytes before the first tensor byte (safetensors length + header; the GGUF reader's data offset)."""
    if path.endswith(".gguf"):
        from ftw.readers.gguf_file import GGUFFile

        f = GGUFFile(path)
        try:
            return f.data_offset
        finally:
            f.close()
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


@pytest.mark.parametrize("level", [None, 3], ids=["raw", "zstd"])
@pytest.mark.parametrize("sample,name", CASES, ids=[c[0].split("/")[1] for c in CASES])
def test_source_cut_short_during_convert_is_an_error_naming_it(tmp_path, sample, name, level):
    src_path = os.path.join(SAMPLES, sample)
    if os.path.isdir(src_path):
        src = tmp_path / "src"
        shutil.copytree(src_path, src)
        cut = src / name
    else:
        src = cut = tmp_path / os.path.basename(src_path)
        shutil.copy(src_path, src)
    out = tmp_path / "out"
    out.mkdir()
    keep = header_end(str(cut)) + 64  # every tensor but the first bytes is gone
    p = run_child(CONVERT_AND_CUT.format(level=level), src, cut, out / "x.ftw", keep)
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)  # -7 would be SIGBUS
    assert "SourceError" in p.stdout and str(cut) in p.stdout, p.stdout
    assert "shrank" in p.stdout or "changed size" in p.stdout, p.stdout
    assert os.listdir(out) == []  # no file, no hidden temporary


def test_ftw_cut_short_during_verify_and_reads_is_an_error_naming_it(tmp_path):
    from ftw.writers.convert import convert

    dst = tmp_path / "x.ftw"
    convert(os.path.join(SAMPLES, "st", "qwen3_moe_bf16"), dst)
    code = """
    import os, sys
    import ftw
    from ftw.errors import FtwError
    path = sys.argv[1]
    with ftw.open(path) as f:
        layer = sorted(f.layers)[-1]
        os.truncate(path, 8192)  # under the open file: the index it parsed is still in memory
        for what, call in (("verify", f.verify), ("bank", lambda: f.bank(layer, "gate_up").sum()),
                           ("expert_row", lambda: f.expert_row(layer, "down", 1).sum())):
            try:
                call()
                print(what, "passed")
            except FtwError as e:
                print(what, type(e).__name__, e)
    """
    p = run_child(code, dst)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    lines = p.stdout.splitlines()
    assert [l.split()[0] for l in lines] == ["verify", "bank", "expert_row"], p.stdout
    for line in lines:
        assert "FormatError" in line and str(dst) in line and "shrank" in line, line


def test_ftw_cut_short_during_check_is_an_error_naming_it(tmp_path):
    """A cut after the map exists and the first layer was compared ends check in a FormatError
    naming the file, never a SIGBUS. (FtwFile.mm re-checks the size on each use; check also
    reads with pread, FtwFile.pread_only, so no window is left between that check and a read.)"""
    from ftw.writers.convert import convert

    src = os.path.join(SAMPLES, "st", "mixed_bf16_nvfp4")
    dst = tmp_path / "x.ftw"
    convert(src, dst)
    code = """
    import os, sys
    import ftw
    from ftw.check import check
    from ftw.errors import FtwError
    from ftw.readers import open_checkpoint
    src, path = sys.argv[1], sys.argv[2]

    def progress(n=0, layers=0):
        if layers:  # one layer compared: cut the file under the check
            os.truncate(path, 8192)

    with ftw.open(path) as f, open_checkpoint(src) as reader:
        f.mm  # mapped before the cut, as a long-running process would have it
        try:
            report = check(reader, f, progress=progress)
            print("report", report.ok)
        except FtwError as e:
            print(type(e).__name__, e)
    """
    p = run_child(code, src, dst)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)  # -7 would be SIGBUS
    assert "FormatError" in p.stdout and str(dst) in p.stdout, p.stdout
