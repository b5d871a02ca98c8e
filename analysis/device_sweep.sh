#!/usr/bin/env bash
# Run an item's sweep on a GPU machine (the embedded profile by default) and export the compact
# rows its table renders from, packed in one archive under $OUT (the device tool brings back at most
# 8 files, 2 folders deep: the rows tree is deeper, hence the archive).
#
#   bash analysis/device_sweep.sh KEY [PROFILE] [-- extra Hydra overrides]
#
# Environment: SWEEP_SECONDS (default 480: stop launching runs after this, inside the device's
# 10-minute limit; every run resumes where it stopped on the next call, as long as the machine is
# still warm: results/runs is git-ignored and kept between calls), BATCH (runner.batch_size,
# default 1: the samples of one cell have equal lengths, so e.g. BATCH=16 batches them; check the
# first cells against BATCH=1 before relying on it), JOBS (processes at once, default 1: the embedded
# model leaves an H100 mostly idle, each step bound by its Python host work, so JOBS=4 runs four shards
# of the cells side by side), OUT (where the archive goes; default results/runs).
# Needs the project's Python dependencies and the embedded model there: `source bench/device_setup.sh`
# first (carried wheels, GGUF parts). The data the cells name is the repository's data/ (it travels
# with the tree).
#
# Then, where the archive came back (repo root):
#   tar xzf rows-KEY-PROFILE.tgz -C results/rows && make <paper>-<item>   # renders; runs nothing done
set -uo pipefail
key=${1:?usage: bash analysis/device_sweep.sh KEY [PROFILE] [-- overrides]}
shift
profile=embedded
if [[ $# -gt 0 && $1 != -- ]]; then profile=$1; shift; fi
[[ ${1:-} == -- ]] && shift
stamp=$(mktemp)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p results/rows "${OUT:-results/runs}"
archive="$(cd "${OUT:-results/runs}" && pwd)/rows-${key}-${profile}.tgz"

timeout --signal=TERM "${SWEEP_SECONDS:-480}" python3 -m analysis run "$key" --profile "$profile" --jobs "${JOBS:-1}" -- \
  "runner.batch_size=${BATCH:-1}" runner.wandb.mode=disabled runner.progress=false "$@"
rc=$?
echo "sweep exit code $rc (124 = stopped at SWEEP_SECONDS: call again to go on)"

# export reads every run of the item's cells, so a call that ran nothing still exports earlier calls'
python3 -m analysis export "$key" --profile "$profile"
python3 -m analysis status "$key" --profile "$profile" | tail -1
(cd results/rows && find . -type f -newer "$stamp" -print0 | tar czf "$archive" --null -T -)
echo "rows written this call: $(tar tzf "$archive" | grep -c . ) file(s) in $archive"
rm -f "$stamp"
[[ $rc == 0 || $rc == 124 ]] || exit "$rc"
