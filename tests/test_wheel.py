"""The wheel as a new user gets it: built by scikit-build-core, installed into a fresh venv,
`ftw convert` + `ftw check` run from there on a bundled sample, and nothing but `ftw` (and the
distribution's metadata) at the top of site-packages.

Slow (compiles the C++ runtime, installs torch from the pip cache into the venv), but part of
the suite that .ci/run runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ftw
import ftw.runtime

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "st" / "mixed_bf16_nvfp4"


def run(cmd, **kw):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert res.returncode == 0, f"{cmd} failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res


@pytest.mark.slow
def test_wheel_installs_and_runs(tmp_path):
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    # the build requirements are in the test venv (scripts/setup.sh puts them there), so no
    # isolated build env; a build folder of its own, not the editable install's build/
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
         "-w", tmp_path / "dist", "-C", f"build-dir={tmp_path / 'build'}", ROOT], env=env)
    wheels = list((tmp_path / "dist").glob("ftw_moe-*.whl"))
    assert len(wheels) == 1, wheels

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    # torch pinned first: the package's range would otherwise pull a multi-GB CUDA build
    run([py, "-m", "pip", "install", "-q", "torch==2.13.0", wheels[0]])

    # from a folder outside the repository, so only the installed package can be imported
    work = tmp_path / "work"
    work.mkdir()
    out = work / "sample.ftw"
    run([venv / "bin" / "ftw", "convert", SAMPLE, out], cwd=work)
    # check exits non-zero on any mismatch (run() asserts the exit status)
    run([venv / "bin" / "ftw", "check", SAMPLE, out], cwd=work)

    probe = (
        "import json, ftw, ftw.cli, ftw.readers.families, ftw.writers, ftw.runtime;"
        "print(json.dumps({'file': ftw.__file__, 'info': ftw.runtime.build_info()}))"
    )
    got = json.loads(run([py, "-c", probe], cwd=work).stdout)
    site = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"]).stdout.strip())
    assert Path(got["file"]).is_relative_to(site), got["file"]
    assert got["info"]["cuda"] == ftw.runtime.build_info()["cuda"]
    assert got["info"]["version"] == ftw.__version__

    # what the wheel installed: every RECORD path under ftw/ or its dist-info, plus the script
    dist_info = [p for p in site.iterdir() if p.name.startswith("ftw_moe-")]
    assert [p.name for p in dist_info] == [f"ftw_moe-{ftw.__version__}.dist-info"]
    record = (dist_info[0] / "RECORD").read_text().splitlines()
    tops = {line.split(",")[0].split("/")[0] for line in record}
    tops.discard("..")  # ../../../bin/ftw: the console script
    assert tops == {"ftw", dist_info[0].name}, tops
    for name in ("readers", "writers", "cli.py", "samples", "tests"):
        assert not (site / name).exists(), f"{name} installed at the top of site-packages"
    assert (site / "ftw" / "readers" / "families" / "__init__.py").is_file()


def test_source_tree_resolves_the_namespace():
    # the editable install (and a plain checkout on sys.path) finds ftw.readers, ftw.writers and
    # ftw.cli in the repository's top-level folders, so edits there are live
    import ftw.cli
    import ftw.readers
    import ftw.writers

    assert Path(ftw.cli.__file__) == ROOT / "cli.py"
    assert Path(ftw.readers.__file__).parent == ROOT / "readers"
    assert Path(ftw.writers.__file__).parent == ROOT / "writers"
