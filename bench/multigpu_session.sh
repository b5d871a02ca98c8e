#!/usr/bin/env bash
# Issue 35 on a lent machine of several GPUs (repo root; `source bench/device_setup.sh` first), logs and
# JSON under $OUT (committed under results/bench/ with the GPU in the name, e.g. multigpu_llama3_70b_h200x4.json,
# declared in analysis/bench_run.py):
#   bash bench/multigpu_session.sh tests   the -m multigpu equality tests (a tiny model split over 2 GPUs)
#   bash bench/multigpu_session.sh x2      Llama-3-8B full attention at 512K/1M and Llama-3-70B at 32K on 2 GPUs
#   bash bench/multigpu_session.sh x4      Llama-3-70B at 32K/100K and Llama-3-8B at 512K/1M on 4 GPUs
# NVLink multicast stays off (KINDS.md): nothing here uses NCCL, the variables are set all the same.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-results/bench}
case ${1:-tests} in
  tests) python3 -m pytest -q -p no:cacheprovider -m multigpu tests/test_multigpu.py 2>&1 | tail -40 | tee "$out/multigpu_tests.log" ;;
  x2)    python3 -m bench.multigpu --model llama3 --contexts 524288 1048576 --methods full --devices 2 \
           --out "$out/multigpu_llama3_1m_x2.json" 2>&1 | tee "$out/multigpu_x2.log"
         python3 -m bench.multigpu --model llama3_70b --contexts 32768 --methods full tidal quest --budget 512 --devices 2 \
           --out "$out/multigpu_llama3_70b_x2.json" 2>&1 | tee -a "$out/multigpu_x2.log" ;;
  x4)    python3 -m bench.multigpu --model llama3_70b --contexts 32768 102400 --methods full tidal quest --budget 512 --devices 4 \
           --out "$out/multigpu_llama3_70b_x4.json" 2>&1 | tee "$out/multigpu_x4.log"
         for n in 2 4; do python3 -m bench.multigpu --model llama3 --contexts 524288 1048576 --methods full --devices $n \
           --out "$out/multigpu_llama3_1m_x$n.json" 2>&1 | tee -a "$out/multigpu_x4.log"; done ;;
  plan)  python3 - <<'PY' 2>&1 | tee "$out/multigpu_plan.log"
import torch
from omegaconf import OmegaConf
from methods import build
from runners import plan as P
from runners.models import config_from_arch
from runners.validate import model_info
for model, method, length, devices, opts in [("llama3_70b", "full", 32768, 1, {"prefill_chunk": 8192}),
                                             ("llama3", "full", 1048576, 1, {"prefill_chunk": 16384}),
                                             ("llama3", "full", 1048576, "auto", {"prefill_chunk": 16384})]:
    cfg = OmegaConf.load(f"conf/model/{model}.yaml"); info = model_info(cfg)
    m = build(OmegaConf.create({"name": method, **opts}), info)
    fp, slope = P.footprint(config_from_arch(cfg.arch), m, info, 1, length, torch.bfloat16, f"{model}, {method}, batch 1 x {length}")
    print(P.plan(fp, P.inventory(), devices, 1, length, slope).line)
PY
  ;;
  *) echo "usage: bash bench/multigpu_session.sh tests|x2|x4|plan"; exit 2 ;;
esac
