"""The destination appears complete or not at all, and an existing file is never damaged.

Two mechanisms (writers/atomic.py): an O_TMPFILE inode linked into place at commit where the
filesystem allows it, else a hidden `.NAME.xxxxxxxx.tmp` beside the destination, which a
reaper process removes when the writer dies without committing (a SIGKILL runs no cleanup
in the writer itself). On both paths the destination is absent or intact at once, and no
stray file outlives the writer for long.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ftw
from ftw.banks import BankSource, LayerBanks
from ftw.errors import DestinationExistsError, FtwError, SourceError
from ftw.formats import LayerFormat
from ftw.writers import FtwWriter
from ftw.writers.atomic import _anonymous_files_link

from helpers_container import rng, write_sample  # noqa: F401 (rng: fixture)

SCRIPT = os.path.join(os.path.dirname(__file__), "slow_writer.py")
ROWS, ROW_KIB = 64, 1024  # a 64 MiB bank, one row fetched every SLEEP_S
SLEEP_S = 0.05
KILL_AT_ROW = 6


def listing(folder) -> set[str]:
    return set(os.listdir(folder))


def leftovers(folder, before: set[str], dest_name: str) -> set[str]:
    """Files that were not there before; only hidden temporaries of dest may ever be."""
    extra = listing(folder) - before
    hidden = re.compile(rf"\.{re.escape(dest_name)}\.[0-9a-f]{{8}}\.tmp")
    assert all(hidden.fullmatch(name) for name in extra), extra
    return extra


def settled_leftovers(folder, before: set[str], dest_name: str, patience_s: float = 30) -> set[str]:
    """leftovers() once the reaper (fallback path) has had its chance to remove them. Not a
    timing check: the patience only bounds how long a failing run waits."""
    deadline = time.monotonic() + patience_s
    while (extra := leftovers(folder, before, dest_name)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return extra


def start_writer(dest, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(dest), str(ROWS), str(ROW_KIB), str(SLEEP_S), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_for_row(proc: subprocess.Popen, row: int) -> None:
    for line in proc.stdout:
        if line.strip() == f"row {row}":
            return
    raise AssertionError(f"writer ended before row {row}: {proc.wait()} {proc.stderr.read()}")


def kill_mid_write(dest, sig: int, *extra: str) -> subprocess.Popen:
    proc = start_writer(dest, *extra)
    try:
        wait_for_row(proc, KILL_AT_ROW)  # rows 0..5 (6 MiB) are in the temporary file by now
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d


def report_path(folder) -> str:
    return "O_TMPFILE" if _anonymous_files_link(str(folder)) else "hidden temporary file"


def test_sigkill_mid_write_leaves_no_destination(folder):
    dest = folder / "model.ftw"
    before = listing(folder)
    proc = kill_mid_write(dest, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert not dest.exists()
    at_once = leftovers(folder, before, dest.name)
    if _anonymous_files_link(str(folder)):
        assert not at_once  # the anonymous inode died with the process
    for name in at_once:  # fallback path: the partial temporary (if the reaper has not removed
        with pytest.raises(FtwError):  # it yet) is never taken for a container
            ftw.open(folder / name)
    assert not settled_leftovers(folder, before, dest.name)
    assert not dest.exists()
    print(f"{report_path(folder)}: right after SIGKILL {sorted(at_once)}; then none")


def test_sigkill_mid_write_leaves_older_file_intact(folder, rng):
    dest = folder / "model.ftw"
    write_sample(dest, rng)
    old = dest.read_bytes()
    old_inode = dest.stat().st_ino
    before = listing(folder)
    kill_mid_write(dest, signal.SIGKILL, "--force")
    assert dest.read_bytes() == old and dest.stat().st_ino == old_inode
    with ftw.open(dest) as f:
        f.verify()
    assert not settled_leftovers(folder, before, dest.name)
    assert dest.read_bytes() == old


def test_sigint_mid_write_cleans_up_everything(folder, rng):
    dest = folder / "model.ftw"
    write_sample(dest, rng)
    old = dest.read_bytes()
    before = listing(folder)
    proc = kill_mid_write(dest, signal.SIGINT, "--force")
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr.read()
    assert dest.read_bytes() == old
    assert listing(folder) == before  # the hidden temporary, if any, was removed


def test_sigint_fresh_destination(folder):
    dest = folder / "model.ftw"
    before = listing(folder)
    kill_mid_write(dest, signal.SIGINT)
    assert not dest.exists() and listing(folder) == before


def test_uninterrupted_subprocess_writer_commits(folder):
    dest = folder / "model.ftw"
    proc = subprocess.run([sys.executable, SCRIPT, str(dest), "3", "4", "0"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert listing(folder) == {dest.name}
    with ftw.open(dest) as f:
        assert f.bank(0, "gate_up").shape == (3, 2, 1024)  # 4 KiB rows: bf16 [2, H] with H = 1024
        f.verify()


def test_exception_inside_with_leaves_no_file(folder, rng):
    dest = folder / "model.ftw"
    before = listing(folder)
    with pytest.raises(ValueError, match="boom"):
        with FtwWriter(dest) as w:
            write_some(w, rng)
            raise ValueError("boom")
    assert not dest.exists() and listing(folder) == before


def test_source_error_leaves_no_file_and_names_the_bank(folder, rng):
    dest = folder / "model.ftw"
    good = rng.integers(0, 256, (2, 100), dtype=np.uint8)
    with pytest.raises(SourceError, match="layer 5 bank down expert 1"):
        with FtwWriter(dest) as w:
            w.add_layer(LayerBanks(5, LayerFormat.of("bf16"), {
                "down": BankSource("u8", (100,), 2, lambda e: [good[e, : 100 - e]]),
            }))
    assert listing(folder) == set()


def test_existing_destination_without_force_is_refused_and_intact(folder, rng):
    dest = folder / "model.ftw"
    write_sample(dest, rng)
    old = dest.read_bytes()
    with pytest.raises(DestinationExistsError, match=re.escape(str(dest))):
        FtwWriter(dest)
    assert dest.read_bytes() == old and listing(folder) == {dest.name}


def test_force_replaces_existing_destination(folder, rng):
    dest = folder / "model.ftw"
    write_sample(dest, rng)
    new = write_sample(dest, rng, force=True, num_experts=2)
    assert listing(folder) == {dest.name}
    with ftw.open(dest) as f:
        assert f.layers[1]["gate_up"].num_experts == 2
        assert f.bank(1, "gate_up").tobytes() == new.banks[(1, "gate_up")].tobytes()


def test_destination_appearing_meanwhile_is_not_clobbered(folder, rng):
    dest = folder / "model.ftw"
    with pytest.raises(DestinationExistsError, match="appeared while converting"):
        with FtwWriter(dest) as w:
            write_some(w, rng)
            dest.write_bytes(b"someone else's file")
    assert dest.read_bytes() == b"someone else's file"
    assert listing(folder) == {dest.name}


def test_destination_is_a_folder_or_in_a_missing_folder(folder):
    with pytest.raises(DestinationExistsError, match="is a folder"):
        FtwWriter(folder)
    with pytest.raises(FtwError, match="does not exist"):
        FtwWriter(folder / "missing" / "model.ftw")


def write_some(w: FtwWriter, rng: np.random.Generator) -> None:
    data = rng.integers(0, 256, (3, 5000), dtype=np.uint8)
    w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {"gate_up": BankSource("u8", (5000,), 3, lambda e: [data[e]])}))
