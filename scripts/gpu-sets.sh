#!/usr/bin/env bash
# After scripts/test-gpu.sh: splits gpu-run/ into sets that each fit one device call's
# 64 MiB carry, for a two-GPU lease run in several calls (docs/benchmarks.md's runs):
#
#   gpu-run/bin-multi   the two-GPU binaries (remote.sh multi): gpu_nccl, gpu_multi,
#                       gpu_direct_copies, gpu_graph
#   gpu-run/bin-x1      every other GPU binary (remote.sh rust-tests sanitize capi)
#   gpu-run/ray-ab      the second part of Ray's wheel (gpu-run/ray-wheels keeps the first)
#
# Host-only binaries (CI runs them) are left out. Before a call, make gpu-run/bin the set
# it needs: `scripts/gpu-sets.sh use multi` (or x1), and carry gpu-run/bin. Ray's parts go
# one per call, back to back: carry gpu-run/ray-wheels first, then gpu-run/ray-ab with
# gpu-run/ray-deps and begin that call with `cp gpu-run/ray-ab/* gpu-run/ray-wheels/`.
set -euo pipefail
cd "$(dirname "$0")/../gpu-run"
MULTI="memarray-cuda__gpu_nccl memarray-cuda__gpu_multi memarray-cuda__gpu_direct_copies memarray-cuda__gpu_graph"
HOST_ONLY="memarray-cuda__mirror_host memarray-cuda__mirror_host_props memarray-seed__memarray_seed memarray-testing__memarray_testing"

if [ "${1:-}" = use ]; then
  set_dir="bin-${2:?usage: gpu-sets.sh use multi|x1}"
  [ -d "$set_dir" ] || { echo "no gpu-run/$set_dir: run scripts/gpu-sets.sh first" >&2; exit 2; }
  rm -rf bin && cp -r "$set_dir" bin
  echo "gpu-run/bin = $set_dir ($(du -sh bin | cut -f1))"
  exit 0
fi

[ -d allbin ] || { [ -d bin ] && mv bin allbin; } || { echo "stage first: scripts/test-gpu.sh" >&2; exit 2; }
rm -rf bin-multi bin-x1 && mkdir bin-multi bin-x1
for f in allbin/*; do
  n=$(basename "$f")
  case " $HOST_ONLY " in *" $n "*) continue ;; esac
  case "$n" in memarray-core__*) continue ;; esac
  case " $MULTI " in
    *" $n "*) cp "$f" bin-multi/ ;;
    *) cp "$f" bin-x1/ ;;
  esac
done
mkdir -p ray-ab
if [ -f ray-wheels/ray.part.ab ]; then mv ray-wheels/ray.part.ab ray-ab/; fi
du -sh bin-multi bin-x1 ray-wheels ray-ab wheels lib peer-wheels nb-wheels 2>/dev/null
