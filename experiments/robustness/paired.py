"""Paired effect of each attack: final eval/accuracy of (defence, attack, seed) minus that of (defence, none, seed),
mean ± std over seeds. Each seed draws its own Synthetic data set, so the grid's ± mixes data sets; the paired
difference removes that part.  python experiments/robustness/paired.py [SWEEP_DIR]  (default multirun/robustness)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from fedsim.report.grid import settings
from fedsim.report.runs import load_runs


def main(root: Path) -> None:
    final = {}
    for run in load_runs(root):
        s = settings(run)
        final[(s["strategy"], s["attack"], run.seed)] = run.curve[-1][1]
    strategies = list(dict.fromkeys(k[0] for k in final))
    attacks = [a for a in dict.fromkeys(k[1] for k in final) if a != "none"]
    print("| defence | " + " | ".join(f"{a} − none" for a in attacks) + " |")
    print("|---|" + "---|" * len(attacks))
    for strategy in strategies:
        cells = []
        for attack in attacks:
            diffs = [
                final[(strategy, attack, seed)] - final[(strategy, "none", seed)]
                for (s, a, seed) in final
                if s == strategy and a == attack and (strategy, "none", seed) in final
            ]
            cells.append(f"{statistics.fmean(diffs):+.4f} ± {statistics.stdev(diffs):.4f}")
        print(f"| {strategy} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "multirun/robustness"))
