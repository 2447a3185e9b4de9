#!/usr/bin/env bash
# Mutation testing of ftw's core modules with mutmut 3 (PyPI). Not part of CI: on 2 cores a full
# run takes hours. Results and the judgement of every surviving mutant: docs/TESTING.md.
#
#   bash scripts/mutation.sh                      # every core module
#   bash scripts/mutation.sh 'ftw.layer_ranges*'  # only mutants whose name matches (mutmut globs)
#   bash scripts/mutation.sh --results            # print the survivors of the last run
#   bash scripts/mutation.sh --pending 'ftw.container*'  # only matching mutants without a verdict
#
# mutmut re-runs EVERY mutant that a name or glob given to it matches, verdict or not (only a
# run given no names keeps earlier verdicts). --pending passes mutmut the names of the matching
# mutants that have no verdict yet, so that a run stopped part way resumes where it stopped.
#
# It never touches this checkout: it clones HEAD (committed code only) into $FTW_MUT_DIR
# (default /tmp/ftw-mutation; kept between runs so mutmut resumes where it stopped; delete it to
# start over) and runs there at nice 19. The tests must import the clone's code, not this
# checkout's: the editable install in .venv puts an import hook first on sys.meta_path that maps
# `ftw` to this checkout. So mutmut runs in its own venv ($FTW_MUT_DIR-venv), made from the base
# interpreter of .venv, which reaches .venv's packages (torch, numpy, pytest, ...) through a plain
# path entry: a path in a .pth file does not run the .pth files beside it, so the hook is never
# installed there.
set -euo pipefail

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
work=${FTW_MUT_DIR:-/tmp/ftw-mutation}
venv=${FTW_MUT_VENV:-$work-venv}
children=${FTW_MUT_CHILDREN:-2}
project_py=${FTW_MUT_PYTHON:-$repo/.venv/bin/python}

if [ ! -x "$venv/bin/mutmut" ]; then
    base=$("$project_py" -c 'import sys; print(sys._base_executable)')
    site=$("$project_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$base" -m venv "$venv"
    vsite=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$site" > "$vsite/zz_project_packages.pth"
    "$venv/bin/pip" install -q "mutmut==3.8.1"
fi

if [ ! -d "$work/.git" ]; then
    git clone -q "$repo" "$work"
    # the wheel's layout (ftw.writers inside ftw/): see source_paths in scripts/mutation.cfg
    mv "$work/writers" "$work/ftw/writers"
    # the C++ runtime is not built in the clone; reuse the checkout's build for the few tests that
    # load it (none of the mutated modules needs it)
    for so in $("$project_py" -c 'import glob, os, sysconfig
p = sysconfig.get_paths()["platlib"]
print(" ".join(glob.glob(os.path.join(p, "ftw", "_runtime*.so"))))'); do
        ln -sf "$so" "$work/ftw/"
    done
fi
cp "$repo/scripts/mutation.cfg" "$work/setup.cfg"

cd "$work"
# the clone's code, not the checkout's, must be what the tests import
"$venv/bin/python" -c 'import ftw, sys; sys.exit(0 if ftw.__file__.startswith(sys.argv[1]) else
    "ftw imports from " + ftw.__file__ + ", not the clone")' "$work/"

if [ "${1:-}" = "--results" ]; then
    exec "$venv/bin/mutmut" results
fi
if [ "${1:-}" = "--pending" ]; then
    shift
    if compgen -G "mutants/ftw/*.py.meta" > /dev/null; then  # mutants were generated before
        mapfile -t pending < <("$venv/bin/python" - "$@" <<'EOF'
import fnmatch, glob, json, sys
for meta in sorted(glob.glob("mutants/**/*.py.meta", recursive=True)):
    for name, code in json.load(open(meta))["exit_code_by_key"].items():
        if code is None and any(fnmatch.fnmatch(name, g) for g in sys.argv[1:] or ["*"]):
            print(name)
EOF
)
        if [ ${#pending[@]} -eq 0 ]; then
            echo "every mutant matching ${*:-*} has a verdict"
            exec "$venv/bin/mutmut" results
        fi
        set -- "${pending[@]}"
    fi
fi
nice -n 19 "$venv/bin/mutmut" run --max-children "$children" "$@"
"$venv/bin/mutmut" results
