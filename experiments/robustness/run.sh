#!/usr/bin/env bash
# Defence x attack grid (issue #20): 9 defences x 6 attacks x 3 seeds = 162 runs, then the grid report.
#   experiments/robustness/run.sh [SWEEP_DIR]      (default multirun/robustness; results/ next to this script)
# The defences' parameters are the strategy options in conf/strategy/ here, added to fedsim's own through
# hydra.searchpath; every attack keeps fedsim's default attack.fraction=0.2 (attack=none has no such key).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
SWEEP=${1:-multirun/robustness}

nice -n 10 "$PY" -m fedsim -m "hydra.searchpath=[file://$PWD/experiments/robustness/conf]" \
    strategy=fedavg,median,trimmed_mean_b20,krum_f4,norm_bounding_m05,centered_clipping_t02,fltrust,bulyan_f4,zeno_b4 \
    attack=none,label_flip,sign_flip,alie,ipm,backdoor seed=0,1,2 \
    model=mlp partition=iid partition.num_clients=20 clients_per_round=20 num_rounds=20 \
    client.optimizer.lr=0.1 client.batch_size=20 executor=serial logger=quiet hydra.sweep.dir="$SWEEP"

"$PY" -m fedsim.report "$SWEEP" --grid strategy attack --metric attack/backdoor_success \
    --out experiments/robustness/results
