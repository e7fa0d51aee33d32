#!/usr/bin/env bash
# Determinism across machines with `basal export` and `basal compare`, for any CI (or by hand).
#
#   examples/ci/determinism.sh export MODEL_DIR REQUESTS.jsonl BACKEND DTYPE OUT_DIR [LABEL]
#       on this machine: export REQUESTS in the three batching modes, require them to be bitwise identical,
#       keep OUT_DIR/LABEL-BACKEND-DTYPE.jsonl (the single-mode export) for the comparison job.
#   examples/ci/determinism.sh compare-all OUT_DIR
#       every pair of exports in OUT_DIR (made on other machines/backends/dtypes): f32 against f32 must agree
#       within 1e-4 per letter logit with the same decisions; the same backend and dtype on two machines must give
#       the same decisions; other pairs (16-bit against f32, ...) are reported, not gated: near-ties may flip.
#
# BASAL overrides the command (default: basal), e.g. BASAL="python -m basal".
set -euo pipefail
BASAL=${BASAL:-basal}

export_here() {
  local model=$1 requests=$2 backend=$3 dtype=$4 out=$5 label=${6:-$(uname -s)-$(uname -m)}
  local work
  mkdir -p "$out"
  work=$(mktemp -d)
  for batching in single batch tree; do
    $BASAL export "$requests" --model "$model" --backend "$backend" --dtype "$dtype" \
      --batching "$batching" --quiet -o "$work/$batching.jsonl"
  done
  # a question's logits must not depend on what it was batched with, on this machine
  $BASAL compare "$work/single.jsonl" "$work/batch.jsonl" --bitwise
  $BASAL compare "$work/single.jsonl" "$work/tree.jsonl" --bitwise
  cp "$work/single.jsonl" "$out/$label-$backend-$dtype.jsonl"
  rm -rf "$work"
}

compare_all() {
  local dir=$1 failed=0 a b na nb
  local files=("$dir"/*.jsonl)
  for ((i = 0; i < ${#files[@]}; i++)); do
    for ((j = i + 1; j < ${#files[@]}; j++)); do
      a=${files[i]} b=${files[j]}
      na=$(basename "$a" .jsonl) nb=$(basename "$b" .jsonl)
      local dta=${na##*-} dtb=${nb##*-}           # LABEL-BACKEND-DTYPE
      local bea=${na%-*} beb=${nb%-*}
      bea=${bea##*-} beb=${beb##*-}
      if [[ $dta == f32 && $dtb == f32 ]]; then
        policy=(--max-logit-diff 1e-4)
      elif [[ $dta == "$dtb" && $bea == "$beb" ]]; then
        policy=()
      else
        echo "== $na vs $nb (report only)"
        $BASAL compare "$a" "$b" || true
        continue
      fi
      echo "== $na vs $nb"
      $BASAL compare "$a" "$b" "${policy[@]}" || failed=1
    done
  done
  return $failed
}

case ${1:-} in
  export) shift; export_here "$@" ;;
  compare-all) shift; compare_all "$@" ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
