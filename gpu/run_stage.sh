#!/usr/bin/env bash
# Train what fits of one stage of sweeps/configs/gpu_depth.py in a fixed time budget, then pack the
# finished runs' records into one file to copy back. Run it again (same command, a new budget) to go on:
# finished runs are skipped and the interrupted one resumes from its checkpoint.
#
#   gpu/run_stage.sh --stage 1 --budget 30m --corpus gpu/data/tokens.tar.xz [--workdir results/gpu_depth]
#                    [--out FILE.tar.gz] [--reserve 90] [-- extra `sweeps.launch run` options]
#
# --corpus   tokens.tar.xz from `python -m scaling.corpus build` (unpacked once into
#            $SCALING_DATA_DIR, default ~/.cache/scaling-data), or an unpacked token cache directory.
# --budget   wall-clock time for this call: 45s, 30m, 1h or seconds. The launcher gets SIGTERM
#            --reserve seconds (default 90) before the end, saves a checkpoint and exits with 75.
# --out      the records archive (default $OUT/<sweep name>-records.tar.gz, else WORKDIR/...): config.json, result.json
#            and metrics.jsonl of every finished run, and sweep.json; no checkpoints.
# GPU_DEPTH_MICRO=1 selects the micro version of the sweep (tests, CPU). For a machine lent one command of
# at most 10 minutes at a time, use gpu/piece.sh instead: runs there must finish inside one command.
#
# Exit status: 0 when the stage is complete, 75 when runs remain (call again), 1 when a run failed,
# 2 for bad arguments (wandb_mode=offline without wandb installed: add -- --set wandb_mode=disabled),
# 3 when a package is missing (one line naming it).
set -euo pipefail

stage="" budget="" corpus="" workdir="results/gpu_depth" out="" reserve=90
extra=()
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "run_stage.sh: error: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --stage) stage="${2:-}"; shift 2 ;;
    --budget) budget="${2:-}"; shift 2 ;;
    --corpus) corpus="${2:-}"; shift 2 ;;
    --workdir) workdir="${2:-}"; shift 2 ;;
    --out) out="${2:-}"; shift 2 ;;
    --reserve) reserve="${2:-}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

[[ "$stage" == 1 || "$stage" == 2 ]] || die "--stage must be 1 or 2"
[[ -n "$corpus" ]] || die "--corpus FILE.tar.xz|DIR is required"
[[ "$reserve" =~ ^[0-9]+$ ]] || die "--reserve must be whole seconds"
case "$budget" in
  *h) seconds=$(( ${budget%h} * 3600 )) ;;
  *m) seconds=$(( ${budget%m} * 60 )) ;;
  *s) seconds=${budget%s} ;;
  *) seconds=$budget ;;
esac
[[ "$seconds" =~ ^[0-9]+$ ]] || die "--budget must look like 45s, 30m, 1h or a number of seconds, got '$budget'"
train_seconds=$(( seconds - reserve ))
(( train_seconds > 0 )) || die "--budget $budget leaves no time after the --reserve of $reserve s"

python="${PYTHON:-python}"
"$python" -c 'from sweeps.piece.packages import exit_if_missing; exit_if_missing("run_stage.sh")'
sweep_file="sweeps/configs/gpu_depth.py"
export GPU_DEPTH_STAGE="$stage"

# The token cache: unpack an archive once (the archive's hash names the folder).
if [[ -d "$corpus" ]]; then
  tokens="$corpus"
elif [[ -f "$corpus" ]]; then
  digest=$(sha256sum "$corpus" | cut -c1-16)
  target="${SCALING_DATA_DIR:-$HOME/.cache/scaling-data}/gpu-depth-corpus-$digest"
  if [[ ! -f "$target/tokens/metadata.json" ]]; then
    mkdir -p "$target.partial"
    tar -xJf "$corpus" -C "$target.partial"
    rm -rf "$target"
    mv "$target.partial" "$target"
  fi
  tokens="$target/tokens"
else
  die "--corpus $corpus: no such file or directory"
fi
[[ -f "$tokens/metadata.json" ]] || die "$tokens is not a token cache (no metadata.json)"

sweep_name=$("$python" -c 'import sys; from sweeps.spec import load_sweep; print(load_sweep(sys.argv[1]).name)' \
  "$sweep_file")
out="${out:-${OUT:-$workdir}/$sweep_name-records.tar.gz}"
echo "run_stage.sh: stage $stage (sweep $sweep_name), $train_seconds s of training, then packing into $out"

status=0
timeout --signal=TERM --kill-after=60 "$train_seconds" \
  "$python" -m sweeps.launch run "$sweep_file" --workdir "$workdir" --set "data.cache_dir=$tokens" \
  --no-progress "${extra[@]}" || status=$?

# Pack the finished runs' records (never checkpoints), in a fixed order.
"$python" - "$workdir/$sweep_name" "$out" <<'PY'
import json, pathlib, sys, tarfile
from scaling.store import records
sweep_dir, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
out.parent.mkdir(parents=True, exist_ok=True)
finished, tokens, seconds = [], 0, 0.0
for result in sorted(sweep_dir.glob("*/result.json")):
    try:
        record = records.read_record(result.parent)
    except (records.RecordError, records.OutdatedRecord):
        continue
    if record is not None and record.status == "finished":
        finished.append(result.parent)
        tokens, seconds = tokens + record.tokens, seconds + record.wall_seconds
def clean(info):
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info
with tarfile.open(out, "w:gz") as tar:
    names = [sweep_dir / "sweep.json"] if (sweep_dir / "sweep.json").exists() else []
    names += [run / name for run in finished for name in ("config.json", "result.json", "metrics.jsonl")
              if (run / name).exists()]
    for path in names:
        tar.add(path, arcname=str(path.relative_to(sweep_dir.parent)), filter=clean)
speed = f", {tokens / seconds:,.0f} tokens/s over them (wall time, compilation included)" if seconds else ""
print(f"run_stage.sh: packed {len(finished)} finished run(s) into {out}{speed}")
PY

case "$status" in
  0) echo "run_stage.sh: stage $stage is complete"; exit 0 ;;
  75|124|137) echo "run_stage.sh: the budget ran out; runs remain: run the same command again to go on"; exit 75 ;;
  *) echo "run_stage.sh: the launcher exited with status $status" >&2; exit 1 ;;
esac
