"""`ftw convert` / `ftw check` end to end: every sample round-trips; --layers, --dry-run,
--force, compression; bad sources fail before the destination exists; interrupted
conversions leave nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ftw
from checking import check
from ftw.writers.convert import convert

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "samples")
MIXED_ST = os.path.join(SAMPLES, "st", "mixed_bf16_nvfp4")
MIXED_GGUF = os.path.join(SAMPLES, "gguf", "qwen3moe-Q4_K_M.gguf")


def _all_samples() -> list[tuple[str, str]]:
    out = []
    with open(os.path.join(SAMPLES, "manifest.json")) as f:
        out += [(n, os.path.join(SAMPLES, s["path"])) for n, s in sorted(json.load(f)["samples"].items())]
    with open(os.path.join(SAMPLES, "gguf", "manifest.json")) as f:
        out += [(n, os.path.join(SAMPLES, "gguf", s["files"][0])) for n, s in sorted(json.load(f)["samples"].items())]
    return out


def ftw_cli(*args, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, os.path.join(ROOT, "cli.py"), *map(str, args)],
                       capture_output=True, text=True, cwd=ROOT)
    if check_rc is not None:
        assert p.returncode == check_rc, p.stderr
    return p


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder))


@pytest.mark.parametrize("name,src", _all_samples(), ids=[n for n, _ in _all_samples()])
def test_every_sample_round_trips(tmp_path, name, src):
    dst = tmp_path / "out.ftw"
    plan = convert(src, dst)
    report = check(src, dst, experts=4)
    assert report.ok, report.to_json()
    assert sorted(report.layers) == [lb.layer for lb in plan.layers]
    with ftw.open(dst) as f:
        for lb in plan.layers:  # the FTW bank is the source's bytes, expert by expert
            for bank_name, bank in lb.banks.items():
                stored = f.bank(lb.layer, bank_name)
                for e in range(bank.num_experts):
                    assert stored[e].tobytes() == bank.row_array(e).tobytes()
        assert report.tensors_compared == len(f.tensors) == len(plan.tensors)
        assert set(f.attachments) == set(plan.attachments)


def test_mixed_sample_has_bf16_ends_and_nvfp4_between(tmp_path):
    dst = tmp_path / "m.ftw"
    convert(MIXED_ST, dst)
    with ftw.open(dst) as f:
        names = [f.layer_formats[l].name for l in sorted(f.layers)]
    assert names[0] == names[-1] == "bf16" and set(names[1:-1]) == {"nvfp4"}


def test_layers_option_writes_only_those_layers(tmp_path):
    dst = tmp_path / "part.ftw"
    with ftw.open(_converted(tmp_path, MIXED_GGUF)) as full:
        all_layers = sorted(full.layers)
    keep = all_layers[1:2]
    ftw_cli("convert", MIXED_GGUF, dst, "--layers", ",".join(map(str, keep)))
    s = json.loads(ftw_cli("inspect", dst, "--json").stdout)
    assert [row["layer"] for row in s["layers"]] == keep
    for t in s["tensors"]:  # other decoder layers' tensors are left out too
        if t["name"].startswith("blk."):
            assert int(t["name"].split(".")[1]) in keep
    assert check(MIXED_GGUF, dst).ok


def _converted(tmp_path, src) -> str:
    dst = str(tmp_path / (os.path.basename(src) + ".full.ftw"))
    if not os.path.exists(dst):
        convert(src, dst)
    return dst


def test_experts_only_and_dry_run(tmp_path):
    dst = tmp_path / "e.ftw"
    p = ftw_cli("convert", MIXED_ST, dst, "--dry-run", "--json")
    plan = json.loads(p.stdout)
    assert not dst.exists() and plan["dry_run"] and plan["layers"]
    assert {row["format"] for row in plan["layers"]} == {"bf16", "nvfp4"}
    ftw_cli("convert", MIXED_ST, dst, "--experts-only")
    with ftw.open(dst) as f:
        assert not f.tensors and [l["layer"] for l in plan["layers"]] == sorted(f.layers)


def test_compressed_conversion_checks_and_loads_the_same(tmp_path):
    raw, z = tmp_path / "raw.ftw", tmp_path / "z.ftw"
    convert(MIXED_ST, raw)
    ftw_cli("convert", MIXED_ST, z, "--compress", "zstd:5", "--threads", "2")
    assert check(MIXED_ST, z).ok
    a, b = ftw.load_expert_banks(raw), ftw.load_expert_banks(z)
    for name in a.banks:
        for layer in a.layers:
            assert np.array_equal(a.banks[name][layer], b.banks[name][layer])


def test_existing_destination_needs_force(tmp_path):
    dst = tmp_path / "x.ftw"
    dst.write_bytes(b"precious")
    p = ftw_cli("convert", MIXED_ST, dst, check_rc=1)
    assert "exists" in p.stderr and "Traceback" not in p.stderr
    assert dst.read_bytes() == b"precious"
    ftw_cli("convert", MIXED_ST, dst, "--force")
    assert check(MIXED_ST, dst).ok


def test_truncated_shard_fails_before_the_destination_exists(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(MIXED_ST, src)
    shard = sorted(p for p in os.listdir(src) if p.endswith(".safetensors"))[-1]
    path = src / shard
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    out = tmp_path / "out"
    out.mkdir()
    p = ftw_cli("convert", src, out / "x.ftw", check_rc=1)
    assert shard in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert listing(out) == []


def test_check_finds_a_changed_source_byte(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(MIXED_ST, src)
    dst = tmp_path / "m.ftw"
    convert(src, dst)
    # flip one byte inside an expert tensor of the last shard's data
    from ftw.readers.safetensors_index import SafetensorsIndex

    index = SafetensorsIndex(src)
    name = next(n for n in index.names() if ".experts." in n and n.endswith("down_proj.weight"))
    info = index.info(name)
    index.close()
    shard = src / os.path.basename(info.shard)
    data = bytearray(shard.read_bytes())
    data[info.offset + 3] ^= 0x40
    shard.write_bytes(bytes(data))
    p = ftw_cli("check", src, dst, check_rc=1)
    assert "difference" in p.stderr and "bank down" in p.stderr and "Traceback" not in p.stderr
    layer = int(name.split(".layers.")[1].split(".")[0])
    assert f"layer {layer}" in p.stderr


SLOW_CONVERT = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # (as tests/slow_writer.py: an inherited SIG_IGN)
sys.path.insert(0, {root!r})
import ftw.writers.ftw_writer as w
orig = w.FtwWriter.add_layer
def slow(self, lb):
    orig(self, lb)
    print("layer", flush=True)
    time.sleep(30)
w.FtwWriter.add_layer = slow
from ftw.cli import main
sys.argv = ["ftw", "convert", {src!r}, {dst!r}] + {extra!r}
main()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
@pytest.mark.parametrize("existing", [False, True])
def test_interrupted_conversion_leaves_nothing(tmp_path, sig, existing):
    out = tmp_path / "out"
    out.mkdir()
    dst = out / "x.ftw"
    old = os.urandom(5000)
    if existing:
        dst.write_bytes(old)
    code = SLOW_CONVERT.format(root=ROOT, src=MIXED_ST, dst=str(dst), extra=["--force"] if existing else [])
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "layer"  # mid-conversion: one layer written
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    if sig == signal.SIGINT:
        assert "interrupted" in err and "Traceback" not in err
    deadline = time.time() + 10  # after SIGKILL the reaper removes the temporary file
    while time.time() < deadline and listing(out) != (["x.ftw"] if existing else []):
        time.sleep(0.05)
    assert listing(out) == (["x.ftw"] if existing else [])
    if existing:
        assert dst.read_bytes() == old


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.ftw"
    bad.write_bytes(os.urandom(10000))
    for args in (("inspect", bad), ("verify", bad), ("convert", tmp_path / "nowhere", tmp_path / "o.ftw"),
                 ("convert", MIXED_ST, tmp_path / "o.ftw", "--layers", "x-1"),
                 ("convert", MIXED_ST, tmp_path / "o.ftw", "--compress", "lz4")):
        p = ftw_cli(*args, check_rc=1)
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert p.stderr.startswith("error:")


def test_mixed_checkpoint_layer_subsets_load_like_the_full_file(tmp_path):
    dst = tmp_path / "m.ftw"
    convert(MIXED_ST, dst)
    full = ftw.load_expert_banks(dst)
    layers = full.layers
    for subset in ([layers[0]], [layers[-1]], layers[1:-1], layers[:2]):
        part = ftw.load_expert_banks(dst, layers=subset, threads=2)
        assert part.layers == subset
        # the bank set is the union over the subset's formats, not the whole file's
        with ftw.open(dst) as f:
            want = set().union(*(f.layers[l] for l in subset))
        assert set(part.banks) == want
        for name, per_layer in part.banks.items():
            for layer, a in per_layer.items():
                assert a.dtype == full.banks[name][layer].dtype
                if a.size:
                    assert np.array_equal(a, full.banks[name][layer])
                else:
                    assert a.shape == (full.num_experts, 0)


def test_convert_inspect_check_never_import_torch(tmp_path):
    dst = tmp_path / "t.ftw"
    code = f"""
import sys
sys.path.insert(0, {ROOT!r})
from ftw.cli import cli
from click.testing import CliRunner
r = CliRunner()
for args in (["convert", {MIXED_ST!r}, {str(dst)!r}], ["inspect", {str(dst)!r}, "--json"],
             ["verify", {str(dst)!r}], ["check", {MIXED_ST!r}, {str(dst)!r}]):
    res = r.invoke(cli, args)
    assert res.exit_code == 0, (args, res.output)
import ftw
ftw.load_expert_banks({str(dst)!r})
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_cli_refuses_bad_levels_and_thread_counts_without_a_traceback(tmp_path):
    p = ftw_cli("convert", MIXED_ST, tmp_path / "o.ftw", "--compress", "zstd:99", check_rc=1)
    assert "level 99" in p.stderr and "Traceback" not in p.stderr
    p = ftw_cli("convert", MIXED_ST, tmp_path / "o.ftw", "--threads", "0", check_rc=2)
    assert "Traceback" not in p.stderr
    assert listing(tmp_path) == []


def test_cli_error_text_is_not_read_as_markup(tmp_path):
    odd = tmp_path / "[/x]" / "[bold]no.ftw"
    p = ftw_cli("inspect", odd, check_rc=1)
    assert "Traceback" not in p.stderr and "[bold]no.ftw" in p.stderr
