# shellcheck shell=bash
# Shared pieces of the tpu/ scripts: flag parsing, quoting, dry-run, slice state.
# Sourced, never run. Every script sets DRY_RUN, NAME, ZONE, PROJECT through
# parse_common_flag before calling anything here. The variables set here are
# read by those scripts, which shellcheck cannot see from this file alone:
# shellcheck disable=SC2034

TPU_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$TPU_DIR")
# Tests point GCLOUD at a fake; dry-run output always says plain `gcloud`.
GCLOUD=${GCLOUD:-gcloud}

DRY_RUN=0
NAME=""
ZONE=""
PROJECT=""
REMOTE_DIR="depth-width-scaling"
SSH_ARGS=()

COMMON_HELP="Slice (all three required):
  --name NAME          TPU VM / pod slice name, e.g. depth-sweep
  --zone ZONE          e.g. us-west4-a (v5e), us-central2-b (v4)
  --project PROJECT    Google Cloud project id

Other:
  --dry-run            print the gcloud commands (one per line, ready to
                       copy-paste) instead of running them; needs no gcloud
  -h, --help           show this help"

REMOTE_HELP="Worker flags (optional):
  --remote-dir DIR     checkout on every worker, relative to the home
                       directory (default: depth-width-scaling)
  --ssh-arg ARG        extra flag for every 'gcloud ... tpu-vm ssh', e.g.
                       --ssh-arg=--tunnel-through-iap (repeatable)"

SCRIPT_NAME=$(basename "$0")

die() {
  echo "$SCRIPT_NAME: error: $*" >&2
  exit 2
}

warn() {
  echo "$SCRIPT_NAME: warning: $*" >&2
}

say() {
  echo "$SCRIPT_NAME: $*" >&2
}

# Prints its arguments as one line that a shell reads back as the same words:
# plain words stay bare, anything else is single-quoted.
shell_quote() {
  local word out=()
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      out+=("$word")
    else
      out+=("'${word//\'/\'\\\'\'}'")
    fi
  done
  echo "${out[*]}"
}

# Joins shell commands into one line, separated by "; ".
join_commands() {
  local joined=$1 command
  shift
  for command in "$@"; do joined+="; $command"; done
  echo "$joined"
}

# Handles the flags every script shares. Sets SHIFT to the number of words
# used (0 when the flag is not a common one).
parse_common_flag() {
  SHIFT=0
  case "$1" in
    --name) need_value "$@"; NAME=$2; SHIFT=2 ;;
    --zone) need_value "$@"; ZONE=$2; SHIFT=2 ;;
    --project) need_value "$@"; PROJECT=$2; SHIFT=2 ;;
    --dry-run) DRY_RUN=1; SHIFT=1 ;;
  esac
}

# The flags of scripts that ssh into workers.
parse_remote_flag() {
  SHIFT=0
  case "$1" in
    --remote-dir) need_value "$@"; REMOTE_DIR=$2; SHIFT=2 ;;
    # Its value is itself a flag, so need_value's guard against one does not apply.
    --ssh-arg) [[ $# -ge 2 ]] || die "--ssh-arg needs a value"; SSH_ARGS+=("$2"); SHIFT=2 ;;
  esac
}

need_value() {
  [[ $# -ge 2 && $2 != --* ]] || die "$1 needs a value (see --help)"
}

require_slice_flags() {
  [[ -n $NAME ]] || die "--name is required (the TPU slice name; see --help)"
  [[ -n $ZONE ]] || die "--zone is required (e.g. us-west4-a; see --help)"
  [[ -n $PROJECT ]] || die "--project is required (your Google Cloud project id; see --help)"
}

require_gcloud() {
  [[ $DRY_RUN == 1 ]] && return 0
  command -v "$GCLOUD" >/dev/null 2>&1 ||
    die "gcloud not found: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), or pass --dry-run to only print the commands"
}

# Runs `gcloud ARGS...`, or prints it under --dry-run.
gcloud_run() {
  if [[ $DRY_RUN == 1 ]]; then
    shell_quote gcloud "$@"
  else
    "$GCLOUD" "$@"
  fi
}

# Runs REMOTE_COMMAND on WORKER (a number or "all") of the slice.
ssh_workers() {
  local worker=$1 remote_command=$2
  gcloud_run compute tpus tpu-vm ssh "$NAME" "--zone=$ZONE" "--project=$PROJECT" \
    "--worker=$worker" ${SSH_ARGS[@]+"${SSH_ARGS[@]}"} --command "$remote_command"
}

# The commit the workers must run: --commit if given, else the local HEAD.
resolve_commit() {
  local wanted=$1 full
  if [[ -z $wanted ]]; then
    full=$(git -C "$REPO_ROOT" rev-parse --verify --quiet HEAD) ||
      die "cannot read the local git commit in $REPO_ROOT; pass --commit SHA"
    echo "$full"
    return
  fi
  # Expand a short sha when this checkout knows it; otherwise trust the caller.
  if full=$(git -C "$REPO_ROOT" rev-parse --verify --quiet "$wanted^{commit}" 2>/dev/null); then
    echo "$full"
  else
    echo "$wanted"
  fi
}

# The repository workers clone: --repo-url if given, else this checkout's origin.
resolve_repo_url() {
  local wanted=$1
  if [[ -n $wanted ]]; then echo "$wanted"; return; fi
  git -C "$REPO_ROOT" remote get-url origin 2>/dev/null ||
    die "--repo-url is required: this checkout has no 'origin' remote to default to"
}

# Log files of one sweep on a worker, relative to REMOTE_DIR.
sweep_log_dir() {
  local stem
  stem=$(basename "$1")
  echo "logs/${stem%.py}"
}

# A shell test, true on a worker whose launcher (log files at "$p.*") runs:
# no exit status yet, and the recorded pid is alive and is a sweep launcher
# (a pid left from before a reboot may belong to something else by now).
# -ww: over ssh without a terminal ps cuts the command line at 80 columns,
# before "sweeps.launch", and a running launcher would look gone.
# shellcheck disable=SC2016
LAUNCHER_RUNNING='[ ! -f "$p.exit" ] && [ -f "$p.pid" ] && ps -ww -o args= -p "$(cat "$p.pid")" 2>/dev/null | grep -q sweeps.launch'

# A remote command that prints, on each worker, one line
# "WORKER_STATE <hostname> <running|done|preempted|failed|idle>" and then the
# last LINES lines of that worker's log, each prefixed with the hostname.
# "preempted" is exit status 75 (EX_TEMPFAIL): the launcher stopped after
# SIGTERM with a checkpoint saved, and launching again resumes it.
worker_state_command() {
  local log_dir=$1 lines=$2
  local dir q_dir
  dir=$(shell_quote "$REMOTE_DIR")
  q_dir=$(shell_quote "$log_dir")
  # $host, $state etc. must expand on the worker, so this text is literal here.
  # shellcheck disable=SC2016
  local body='host=$(hostname); p='"$q_dir"'/$host; state=idle;
if [ -f "$p.exit" ]; then case "$(cat "$p.exit")" in 0) state=done;; 75) state=preempted;; *) state=failed;; esac;
elif '"$LAUNCHER_RUNNING"'; then state=running; fi;
echo "WORKER_STATE $host $state"'
  if [[ $lines -gt 0 ]]; then
    # shellcheck disable=SC2016
    body+='; if [ -f "$p.log" ]; then tail -n '"$lines"' "$p.log" | sed "s/^/$host| /"; fi'
  fi
  body=${body//$'\n'/ }
  echo "cd $dir 2>/dev/null || { echo \"WORKER_STATE \$(hostname) idle\"; exit 0; }; $body"
}

# One word for the slice: READY, PENDING (being created or queued), PREEMPTED
# (exists but must be deleted and re-created), MISSING, or UNKNOWN (gcloud
# failed for another reason, e.g. network; the caller should wait and retry).
slice_state() {
  local queued=$1 out
  if [[ $queued == 1 ]]; then
    if ! out=$("$GCLOUD" compute tpus queued-resources describe "$NAME" "--zone=$ZONE" \
      "--project=$PROJECT" "--format=value(state.state)" 2>&1); then
      if [[ $out == *NOT_FOUND* || $out == *"not found"* ]]; then echo MISSING; else echo UNKNOWN; fi
      return
    fi
    case "$out" in
      ACTIVE) ;;  # the node exists; its own state decides below
      SUSPENDING | SUSPENDED | FAILED) echo PREEMPTED; return ;;
      *) echo PENDING; return ;;
    esac
  fi
  if ! out=$("$GCLOUD" compute tpus tpu-vm describe "$NAME" "--zone=$ZONE" \
    "--project=$PROJECT" "--format=value(state)" 2>&1); then
    if [[ $out == *NOT_FOUND* || $out == *"not found"* ]]; then echo MISSING; else echo UNKNOWN; fi
    return
  fi
  case "$out" in
    READY) echo READY ;;
    PREEMPTED | TERMINATED | STOPPED) echo PREEMPTED ;;
    *) echo PENDING ;;
  esac
}

# The describe query that lists a slice's workers: one network endpoint each.
WORKERS_QUERY_FORMAT="--format=value(networkEndpoints[].ipAddress)"

# The number of workers (hosts) of the slice, asked from gcloud.
slice_worker_count() {
  local out
  out=$("$GCLOUD" compute tpus tpu-vm describe "$NAME" "--zone=$ZONE" "--project=$PROJECT" \
    "$WORKERS_QUERY_FORMAT") || die "cannot ask gcloud for the workers of $NAME; pass --workers N"
  out=${out//;/ }
  # shellcheck disable=SC2086 # word splitting counts the addresses
  set -- $out
  [[ $# -ge 1 ]] || die "gcloud lists no workers for $NAME; pass --workers N"
  echo "$#"
}
