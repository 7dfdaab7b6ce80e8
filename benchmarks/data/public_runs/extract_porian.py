"""Extract `porian_isoflop.csv` from a snapshot of github.com/formll/resolving-scaling-law-discrepancies.

    python benchmarks/data/public_runs/extract_porian.py PORIAN_GIT_DIR

Its `data/summary_df*.pickle.xz` are pickled pandas frames: a pickle from elsewhere can run any
callable it names, so they are read with an unpickler that resolves only the pandas and numpy
classes these files name (listed with `pickletools`) and refuses any other. Each frame's rows are
the paper's settings; each row's `optimal_pairs` holds, per FLOP budget, the iso-FLOP runs' sizes,
tokens and losses, which are the columns written here.
"""

from __future__ import annotations

import csv
import io
import lzma
import pickle
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("data/summary_df.pickle.xz", "data/summary_df_owt2.pickle.xz")
# Every global these pickles reference: the frame, its blocks and index, and numpy arrays.
ALLOWED = {
    ("pandas.core.frame", "DataFrame"),
    ("pandas.core.series", "Series"),
    ("pandas.core.internals.managers", "BlockManager"),
    ("pandas.core.internals.managers", "SingleBlockManager"),
    ("pandas._libs.internals", "_unpickle_block"),
    ("pandas.core.indexes.base", "_new_Index"),
    ("pandas.core.indexes.base", "Index"),
    ("pandas.core.indexes.range", "RangeIndex"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("builtins", "slice"),
}


class FrameOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"refusing {module}.{name}: not a class of a pandas frame")
        return super().find_class(module, name)


def main(git_dir: str) -> None:
    with open(HERE / "porian_isoflop.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["dataset", "hparams", "warmup", "decay", "param_count", "loss_of", "flops", "params",
                      "tokens", "loss"])  # fmt: skip
        for path in FILES:
            raw = subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{path}"], check=True,
                                 capture_output=True).stdout  # fmt: skip
            frame = FrameOnly(io.BytesIO(lzma.decompress(raw))).load()
            for _, setting in frame.iterrows():
                keys = [setting[k] for k in ("dataset", "hparams", "warmup", "decay", "param_count", "val")]
                for _, budget in setting["optimal_pairs"].iterrows():
                    runs = zip(budget["n_vals"], budget["t_vals"], budget["loss_vals"], strict=True)
                    for n, t, loss in sorted(runs):
                        out.writerow([*keys, f"{budget['flops']:.4g}", round(n), round(t), f"{loss:.5f}"])


if __name__ == "__main__":
    main(sys.argv[1])
