"""Issue 9, section 2, at the command line: user text prints literally (rich markup in paths
and index strings), every error is one line naming the file, bad option values are errors
not tracebacks, long destination names work, and a late Ctrl-C says what is true."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys

import pytest
import xxhash

import ftw
from helpers_container import index_of, with_index

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "samples", "st", "qwen3_moe_bf16")
MARKUP = ["[/bold]", "[v2]", "[red]", "[/]", "[bold red on blue]x", "tail\\"]


def cli(*args, rc: int | None = 0, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, os.path.join(ROOT, "cli.py"), *map(str, args)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300, **kw)
    if rc is not None:
        assert p.returncode == rc, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def flat(text: str) -> str:
    """Output without the whitespace rich adds when it wraps a long cell or line."""
    return "".join(text.split()).replace("│", "").replace("┃", "")


def one_line(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    return lines[0]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("m") / "[red]a[/bold]b[v2]"
    folder.mkdir(parents=True)  # "[/bold]" is two folders: the path prints whole all the same
    dst = folder / "m[v2]x[red].ftw"
    cli("convert", SAMPLE, dst)
    return dst


def test_markup_in_paths_prints_literally(converted):
    name = "m[v2]x[red].ftw"
    for args in (("inspect", converted), ("verify", converted), ("check", SAMPLE, converted)):
        p = cli(*args)
        assert name in flat(p.stdout) and "[red]a[/bold]b[v2]" in flat(p.stdout), (args, p.stdout)
    p = cli("convert", SAMPLE, converted.with_name("again[bold].ftw"))
    assert "[/bold]b[v2]/again[bold].ftw" in flat(p.stdout)
    p = cli("convert", SAMPLE, converted.with_name("dry[red].ftw"), "--dry-run")
    assert "Plan" in p.stdout


def test_markup_in_index_strings_prints_literally(tmp_path, converted):
    data = converted.read_bytes()
    index = index_of(data)
    layer = sorted(index["layers"])[0]
    index["model"]["family"] = "fam[/bold]"
    index["provenance"]["reader"] = "reader[red]"
    index["provenance"]["source"] = "src[v2]"
    # an unknown format (with banks it names itself) still opens and verifies
    index["layer_quant_formats"][layer] = {"name": "fmt[/]", "options": {"k[/bold]": "v[red]"}}
    banks = index["layers"][layer]["banks"]
    index["layers"][layer]["banks"] = {f"{n}[/x]": b for n, b in banks.items()}
    index["attachments"] = {f"{n}[/a]": b for n, b in index["attachments"].items()}
    odd = tmp_path / "odd.ftw"
    odd.write_bytes(with_index(data, index))
    out = flat(cli("inspect", odd).stdout)
    for s in ("fam[/bold]", "reader[red]", "src[v2]", "fmt[/]", '"k[/bold]":"v[red]"', "gate_up[/x]", "config.json[/a]"):
        assert s in out, (s, out)
    assert "odd.ftw" in flat(cli("verify", odd).stdout)
    p = cli("check", SAMPLE, odd, rc=1)  # the file differs from the source: said literally, not crashed
    assert "fmt[/]" in flat(p.stdout + p.stderr)
    assert json.loads(cli("inspect", odd, "--json").stdout)["model"]["family"] == "fam[/bold]"


@pytest.mark.parametrize("bad", MARKUP)
def test_markup_in_a_missing_path_is_one_literal_line(tmp_path, bad):
    missing = tmp_path / f"no{bad}.ftw"
    for args in (("inspect", missing), ("verify", missing), ("convert", tmp_path / f"src{bad}", tmp_path / "o.ftw")):
        line = one_line(cli(*args, rc=1))
        assert bad in line, line


def test_newline_in_a_path_stays_on_one_line(tmp_path):
    odd = tmp_path / "a\nb\rc.ftw"
    line = one_line(cli("inspect", odd, rc=1))
    assert "a\\nb\\rc.ftw" in line


@pytest.mark.parametrize("value", ["zstd:²", "zstd:--3", "zstd:٣", "zstd:", "zstd:3.5", "zstd:1e3", "zstd:99999999999"])
def test_bad_compress_values_are_one_line(tmp_path, value):
    line = one_line(cli("convert", SAMPLE, tmp_path / "o.ftw", "--compress", value, rc=1))
    assert "--compress" in line or "zstd level" in line
    assert not (tmp_path / "o.ftw").exists()


@pytest.mark.parametrize("value,needle", [
    ("0-10000000000", "goes past the model's 3 layers"), ("0-3", "goes past"), ("²", "not a layer index"),
    ("1--2", "not a layer index"), ("99999999999999999999999", "not a layer index"),
])
def test_layer_ranges_are_bounded_by_the_model(tmp_path, value, needle):
    line = one_line(cli("convert", SAMPLE, tmp_path / "o.ftw", "--layers", value, rc=1))
    assert needle in line, line


def test_inspect_layers_bounded_by_the_file(converted):
    line = one_line(cli("inspect", converted, "--layers", "0-10000000000", rc=1))
    assert "goes past" in line
    assert json.loads(cli("inspect", converted, "--layers", "1-2", "--json").stdout)["totals"]["moe_layers"] == 2


@pytest.mark.parametrize("length", [240, 250, 255])
def test_long_destination_names_work(tmp_path, length):
    name = ("n" * (length - 4)) + ".ftw"
    dst = tmp_path / name
    cli("convert", SAMPLE, dst)
    with ftw.open(dst) as f:
        assert f.verify() > 0
    assert os.listdir(tmp_path) == [name]  # no temporary left behind
    cli("convert", SAMPLE, dst, "--force")  # replacing goes through the hidden name too


def test_a_write_failure_names_the_destination(tmp_path):
    """RLIMIT_FSIZE makes write() fail with EFBIG ('File too large'), as a full disk fails
    with ENOSPC: the message must name the file, and nothing is left behind."""
    dst = tmp_path / "big.ftw"

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    line = one_line(cli("convert", SAMPLE, dst, rc=1, preexec_fn=limit))
    # write() says EFBIG; copy_file_range past the limit may say EINVAL: the file is named either way
    assert str(dst) in line and ("File too large" in line or "Invalid argument" in line), line
    assert os.listdir(tmp_path) == []


def _interrupted(tmp_path, after: bool) -> tuple[subprocess.CompletedProcess, str]:
    """convert with a KeyboardInterrupt raised right after (or right before) the commit's
    rename: where a real SIGINT can land."""
    dst = str(tmp_path / "i.ftw")
    code = f"""
import sys
sys.path[:0] = [{ROOT!r}]
from ftw.writers import atomic
real = atomic.os.replace if False else None
orig = atomic.AtomicFile._commit
def commit(self):
    if not {after}:
        raise KeyboardInterrupt
    orig(self)
    raise KeyboardInterrupt
atomic.AtomicFile._commit = commit
sys.argv = ["ftw", "convert", {SAMPLE!r}, {dst!r}]
from ftw.cli import main
main()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return p, dst


def test_ctrl_c_after_the_commit_says_the_file_is_there(tmp_path):
    p, dst = _interrupted(tmp_path, after=True)
    assert p.returncode == 130 and "Traceback" not in p.stderr, p.stderr
    assert "written in full" in p.stderr and "nothing was written" not in p.stderr, p.stderr
    with ftw.open(dst) as f:
        assert f.verify() > 0


def test_ctrl_c_before_the_commit_says_nothing_was_written(tmp_path):
    p, dst = _interrupted(tmp_path, after=False)
    assert p.returncode == 130 and "nothing was written" in p.stderr, p.stderr
    assert os.listdir(tmp_path) == []


def test_index_checksum_of_the_file_is_unchanged_by_printing(converted):
    """Printing never touches the file (a sanity check on the fixture the tests above share)."""
    data = converted.read_bytes()
    cli("inspect", converted)
    assert xxhash.xxh3_64_hexdigest(converted.read_bytes()) == xxhash.xxh3_64_hexdigest(data)


def test_inspect_of_a_wide_index_is_plain_columns_printed_literally(tmp_path):
    """Past 2,000 table rows inspect prints plain aligned columns in one pass (rich takes
    ~0.5 ms a row); user text stays literal there too, and on one line per row."""
    from test_robust_container import build

    for n in (20, 2500):  # rich's table, then plain columns
        p = tmp_path / f"wide{n}.ftw"
        build(p, {(i, "b[/bold]\nx"): ("u8", (4, 0), b"") for i in range(n)})
        out = cli("inspect", p).stdout
        assert flat(out).count("b[/bold]\\nx") == n, out[:2000]
        assert len(out.splitlines()) < n + 40
    js = json.loads(cli("inspect", p, "--json").stdout)
    assert js["totals"]["moe_layers"] == n


from datetime import timedelta  # noqa: E402

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(derandomize=True, database=None, deadline=timedelta(seconds=2), max_examples=300)
@given(text=st.text(st.sampled_from("0123456789-,² ٣x"), max_size=40), limit=st.none() | st.integers(0, 1 << 20))
def test_fuzz_layer_ranges_and_levels(text, limit):
    """Any --layers text is a sorted list within the bound or one FtwError, at once; any
    --compress text a level or one FtwError."""
    from ftw.cli import parse_compress
    from ftw.errors import FtwError
    from ftw.layer_ranges import parse_layers

    try:
        layers = parse_layers(text, limit)
    except FtwError as e:
        assert "\n" not in str(e)
    else:
        bound = min(limit if limit is not None else 1 << 16, 1 << 16)
        assert layers is None or (layers == sorted(set(layers)) and all(0 <= x < bound for x in layers))
    try:
        parse_compress("zstd:" + text)
    except FtwError as e:
        assert "\n" not in str(e)
