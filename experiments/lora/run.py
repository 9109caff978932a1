"""Full fine-tuning, FedIT, FFA-LoRA and FedSA-LoRA on lora_tiny's task, 3 seeds: bytes sent, final loss and
perplexity, the spread of the clients' perplexities, wall time.

The task is ``experiment=lora_tiny`` (a 2-layer GPT-2 of hidden size 64 initialised from the seed, data=synthetic_text:
20 clients, each its own Markov chain over 16 tokens, alpha 0.5), 5 clients a round, Adam lr 0.01 (0.003 for full
fine-tuning), every client scored on its own held-out windows at the last round. Each method changes only what
it names (CONFIGS).
Usage: python experiments/lora/run.py [--rounds 50] [--seeds 0 1 2] [--out experiments/lora]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from fedsim.run import compose, run_config

SETTING = ["experiment=lora_tiny", "executor=serial", "logger=quiet", "eval_every=1000"]  # scored at the last round
CONFIGS = {
    "full fine-tuning": ["adapter=none", "client.optimizer.lr=0.003"],  # at 0.01 Adam, every weight: worse (README)
    "FedIT": ["adapter=lora", "strategy=fedavg"],
    "FFA-LoRA": ["adapter=ffa_lora", "adapter.target_modules=[c_attn]"],
    "FedSA-LoRA": ["adapter=lora", "strategy=fedsa_lora"],
}


def final_values(history: list[dict], personal: bool) -> dict[str, float]:
    """What the table shows from a run's history: bytes over the run, the last round's losses and the spread of the
    clients' perplexities under the model each client uses (its personal one for FedSA-LoRA)."""
    last = history[-1]
    clients = "eval_personal" if personal else "eval_global"
    return {
        "bytes_up_total": last["comm/bytes_up_total"],
        "bytes_down_total": last["comm/bytes_down_total"],
        "train_loss": last["train/loss"],
        "eval_loss": last["eval/loss"],
        "eval_perplexity": last["eval/perplexity"],
        "client_perplexity_mean": last[f"{clients}/perplexity_mean"],
        "client_perplexity_p10": last[f"{clients}/perplexity_p10"],
        "client_perplexity_p90": last[f"{clients}/perplexity_p90"],
        "client_perplexity_std": last[f"{clients}/perplexity_std"],
    }


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def table(summary: dict[str, dict[str, tuple[float, float]]]) -> str:
    """The README's Markdown table: mean ± std over seeds."""
    columns = [
        ("MB up (run)", "bytes_up_total", 1e-6, ".3f"),
        ("train loss", "train_loss", 1, ".3f"),
        ("test loss", "eval_loss", 1, ".3f"),
        ("test ppl", "eval_perplexity", 1, ".2f"),
        ("client ppl mean", "client_perplexity_mean", 1, ".2f"),
        ("client ppl p10", "client_perplexity_p10", 1, ".2f"),
        ("client ppl p90", "client_perplexity_p90", 1, ".2f"),
        ("client ppl std", "client_perplexity_std", 1, ".2f"),
        ("wall s", "wall_time_s", 1, ".1f"),
    ]
    lines = ["| method | " + " | ".join(c[0] for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, values in summary.items():
        cells = [f"{values[key][0] * scale:{fmt}} ± {values[key][1] * scale:{fmt}}" for _, key, scale, fmt in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--run-root", type=Path, default=Path("/tmp/fedsim_lora"))
    args = parser.parse_args()
    start = time.perf_counter()
    run_root = args.run_root / time.strftime("%Y%m%d-%H%M%S")
    runs: dict[str, dict[int, dict[str, float]]] = {name: {} for name in CONFIGS}
    run_config(compose([*SETTING, "num_rounds=1"]), run_root / "warm-up")  # imports and first calls: untimed
    for seed in args.seeds:
        for name, overrides in CONFIGS.items():
            cfg = compose([*SETTING, *overrides, f"num_rounds={args.rounds}", f"seed={seed}"])
            t0 = time.perf_counter()
            history = run_config(cfg, run_root / f"{name.replace(' ', '_')}-seed{seed}").history
            runs[name][seed] = final_values(history, personal=name == "FedSA-LoRA")
            runs[name][seed]["wall_time_s"] = time.perf_counter() - t0
            print(f"seed {seed} {name:16s} " + "  ".join(f"{k} {v:.4g}" for k, v in runs[name][seed].items()))
    summary = {
        name: {key: mean_std([per_seed[s][key] for s in args.seeds]) for key in per_seed[args.seeds[0]]}
        for name, per_seed in runs.items()
    }
    assert all(math.isfinite(v[0]) for values in summary.values() for v in values.values())
    wall = time.perf_counter() - start
    result = {"setting": SETTING, "configs": CONFIGS, "rounds": args.rounds, "seeds": args.seeds}
    result |= {"summary_mean_std_over_seeds": summary, "runs": runs, "wall_time_s": wall}
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(summary))
    print(f"total wall time {wall:.0f} s")


if __name__ == "__main__":
    main()
