#!/usr/bin/env bash
# One piece of sweeps/configs/gpu_depth.py on a lent GPU machine: the next runs that fit the budget
# (default 8 minutes, installing included), trained packed, with wandb disabled; records, piece.json
# and timing.md under $OUT. Run it from anywhere; it runs `python -m sweeps.piece run` from the
# repository root, with the wheels in gpu/wheels and the corpus archive gpu/data/tokens.tar.xz.
#
#   gpu/piece.sh --stage 1 --commit SHA [--budget 8m] [--out DIR] [--set KEY=VALUE ...]
#
# Exit status: 0 the stage is complete; 75 runs remain (run the next piece); 1 a run failed or
# diverged; 2 bad arguments; 3 packages missing that gpu/wheels cannot supply; 4 the corpus archive
# is missing or not the committed one; 5 the next pack cannot finish inside any piece.
# All options: gpu/piece.sh --help. Then, here: python -m sweeps.piece accept COPY_OF_OUT --stage 1.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" -m sweeps.piece run "$@"
