"""A writer that is slow on purpose, for killing mid-write (tests/test_writer_atomic.py).

    python tests/slow_writer.py DEST ROWS ROW_KIB SLEEP_S [--force]

Prints "row E" (flushed) as the writer fetches each expert row, so the parent knows how far
the write has got; the rows written before it are already in the temporary file.
"""

import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ftw.banks import BankSource, LayerBanks  # noqa: E402
from ftw.formats import LayerFormat  # noqa: E402
from ftw.writers import FtwWriter  # noqa: E402


def main() -> None:
    # Ctrl-C as an interactive user has it, also where this test run was started with SIGINT
    # ignored (a background job of a non-interactive shell, nohup): Python keeps an inherited
    # SIG_IGN, and the SIGINT tests would then wait for a writer that never stops
    signal.signal(signal.SIGINT, signal.default_int_handler)
    dest, rows, row_kib, sleep_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    rng = np.random.default_rng()
    # a valid bf16 layer with I = 1: gate_up [2, H] is the ROW_KIB-sized row, down [H, 1]
    H = row_kib << 8
    data = rng.integers(0, 1 << 16, (rows, 2, H), dtype=np.uint16)
    down = rng.integers(0, 1 << 16, (rows, H, 1), dtype=np.uint16)

    def row(e: int):
        print(f"row {e}", flush=True)
        time.sleep(sleep_s)
        return [data[e]]

    with FtwWriter(dest, force="--force" in sys.argv) as w:
        w.add_layer(LayerBanks(0, LayerFormat.of("bf16"), {
            "gate_up": BankSource("bf16", (2, H), rows, row),
            "down": BankSource("bf16", (H, 1), rows, lambda e: [down[e]]),
        }))
    print("done", flush=True)


if __name__ == "__main__":
    main()
