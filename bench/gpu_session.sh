#!/usr/bin/env bash
# GPU checks in one command, for a machine whose own python3 holds a CUDA torch:
#
#   bash bench/gpu_session.sh env       versions, torchao int8/fp8 on the GPU, the demo
#   bash bench/gpu_session.sh memory    bench/gpu_memory.py on FAMILIES (sd15,sdxl,flux)
#   bash bench/gpu_session.sh env memory
#   bash bench/gpu_session.sh swap      model.blocks_to_swap: the 24 GB Qwen-Image preset
#                                       under a 23.5 GiB allocator cap, and without swapping
#                                       uncapped (the s/step ratio); SWAP_CASES to change
#                                       (bench/gpu_memory.py CASES: also qwen_image_16gb,
#                                       wan14b_24gb, wan22_a14b_24gb, flux2_dev_24gb; the Wan
#                                       cases validate to video: carry PyAV's wheel too),
#                                       SWAP_STEPS (10)
#   bash bench/gpu_session.sh peers     bench/peers.py: this tool against diffusers' own
#                                       example trainers on random:<family> folders, bf16,
#                                       gradient checkpointing, train.compile off and blocks
#                                       (PEERS_CASES family:resolution:batch, in order; a
#                                       case left without time is skipped, and says so;
#                                       each run's train.log names its host syncs)
#
# Settings (environment): PY (python3), FAMILIES, MEMORY_S (500: the whole memory
# stage), CASE_S (200: one family's run), FP8_S (unset: also Flux with an fp8 base, in
# that many seconds), PEERS_DIR (the diffusers examples; a GPU machine gets no ../shared,
# so copy ../shared/peers/diffusers-examples into an ignored folder and carry it), OUT (/tmp/gpu-out: the log and the result files), PEERS_S (480:
# the whole peers stage), PEERS_STEPS (20), PEERS_COMPILE (off,blocks), PEERS_PY (a python with torchvision and
# datasets for the examples; default PY, whose .whl/ may add them: torchvision's wheel
# must be the one made for that machine's torch).
#
# A machine without a registry gets the packages its python lacks as wheels in .whl/:
# `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux_2_28_x86_64 -d .whl diffusers==... transformers==... peft==... torchao==...
# pytorch_optimizer==... tomli_w==...` (the versions requirements.txt pins); they are
# installed under /tmp/site and put first on PYTHONPATH. 2026-11-26 on an H200:
# docs/memory.md.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY=${PY:-python3}

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

stage_env() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  timeout 120 "$PY" - <<'EOF'
import sys
from importlib.metadata import version
import torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA GPU"
print("python", sys.version.split()[0], "| torch", torch.__version__, "|", gpu)
for name in ("diffusers", "transformers", "accelerate", "peft", "torchao", "safetensors",
             "tokenizers", "huggingface_hub", "pillow"):
    try:
        print(f"  {name} {version(name)}")
    except Exception as exc:
        print(f"  {name}: {exc}")
import core.train.main, core.models.quantize  # noqa: F401  (import check)
print('core imports ok')
EOF
  timeout 120 "$PY" - <<'EOF'
import copy
import torch
from torch import nn
from core.models.quantize import quantize_frozen, quantized_layers
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
for scheme in ("int8", "fp8"):
    layer = nn.Sequential(nn.Linear(256, 256)).to(torch.bfloat16)
    x = torch.randn(4, 256, device=dev, dtype=torch.bfloat16)
    want = copy.deepcopy(layer).to(dev)(x)
    try:
        quantize_frozen(layer, scheme, dev)
        got = layer(x)
        err = ((got - want).abs().max() / want.abs().max()).item()
        print(f"quantize {scheme} on {dev}: ok, relative error {err:.4f}, "
              f"{quantized_layers(layer)}")
    except Exception as exc:
        print(f"quantize {scheme} on {dev}: FAILED {type(exc).__name__}: {exc}")
EOF
  local ws=/tmp/ws-demo start=$SECONDS
  rm -rf "$ws"
  timeout 240 "$PY" app.py --no-ui --preset demo --workspace "$ws"
  echo "demo exit $? in $((SECONDS - start)) s"
  cp "$ws/runs/demo/validation/grid.png" "$OUT/demo-grid.png" 2>/dev/null
  cp "$ws/runs/demo/events.jsonl" "$OUT/demo-events.jsonl" 2>/dev/null
  tail -n 30 "$ws/runs/demo/train.log" > "$OUT/demo-train-tail.log" 2>/dev/null
}

stage_memory() {
  local ws=/tmp/ws-memory
  timeout "${MEMORY_S:-500}" "$PY" bench/gpu_memory.py --families "${FAMILIES:-sd15,sdxl,flux}" \
    --steps 10 --timeout "${CASE_S:-200}" --workspace "$ws" --out "$OUT/gpu_memory.json"
  echo "gpu_memory exit $?"
  if [ -n "${FP8_S:-}" ]; then
    timeout "$FP8_S" "$PY" bench/gpu_memory.py --families flux --quantize fp8 --steps 10 \
      --timeout "$FP8_S" --workspace "$ws" --out "$OUT/gpu_memory_fp8.json"
    echo "gpu_memory fp8 exit $?"
  fi
}

stage_swap() {
  local ws=/tmp/ws-swap
  timeout "${MEMORY_S:-560}" "$PY" bench/gpu_memory.py \
    --families "${SWAP_CASES:-qwen_image_24gb,qwen_image_noswap}" \
    --steps "${SWAP_STEPS:-10}" --timeout "${CASE_S:-240}" --workspace "$ws" --out "$OUT/gpu_swap.json"
  echo "gpu_memory swap exit $?"
}

stage_peers() {
  local ws=/tmp/ws-peers deadline=$((SECONDS + ${PEERS_S:-480})) case fam res batch left
  if ! "${PEERS_PY:-$PY}" -c "import torchvision, datasets" 2>/dev/null; then
    echo "peers: ${PEERS_PY:-$PY} lacks torchvision or datasets (add their wheels to .whl/)"
    return 1
  fi
  # What no GPU session has measured yet first (sd15, sdxl and flux were, docs/performance.md).
  for case in ${PEERS_CASES:-qwen_image:1024:1 krea2:1024:1 ideogram4:1024:1 z_image:1024:1}; do
    IFS=: read -r fam res batch <<< "$case"
    left=$((deadline - SECONDS))
    if [ "$left" -lt 60 ]; then echo "peers: $case skipped, ${left} s left"; continue; fi
    STEPTIMER_SYNC_DEBUG=1 timeout "$left" "$PY" bench/peers.py --families "$fam" --models random \
      --resolution "$res" --batch "$batch" --precision bf16 --gradient-checkpointing \
      --steps "${PEERS_STEPS:-20}" --warmup 5 --compile "${PEERS_COMPILE:-off,blocks}" \
      --peers-python "${PEERS_PY:-$PY}" --timeout "$left" --workspace "$ws" \
      --out "$OUT/peers-$fam.json"
    echo "peers $case exit $?"
    find "$ws/tool" -name train.log 2>/dev/null | while read -r log; do
      echo "== $log"; grep -v -E "^\s*$" "$log" | tail -n 30
    done > "$OUT/peers-$fam-tool-logs.txt"
    rm -rf "$ws/models" "$ws/peers" "$ws/tool"  # a full-size folder is tens of GB on disk
  done
}

for stage in "$@"; do
  echo "=== $stage $(date -u +%T)"
  "stage_$stage"
done
echo "=== done $(date -u +%T)"
