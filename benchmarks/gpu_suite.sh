#!/usr/bin/env bash
# The GPU benchmarks of docs/fp8.md and docs/gpu.md in one command, under one
# time budget, on any machine with an NVIDIA GPU and torch (CUDA build), jax
# with its CUDA plugin (e.g. jax 0.11.2, jax-cuda13-plugin), torchax 0.0.13 and
# expecttest (or their wheels, below); no torch_xla. From the checkout's root:
#
#   bash benchmarks/gpu_suite.sh                          # the default parts
#   PARTS=fp8-mlp,gpu-lm bash benchmarks/gpu_suite.sh     # only those parts
#   BUDGET=300 OUT=/tmp/gpu bash benchmarks/gpu_suite.sh  # 300 s in all, there
#   FLAG_SETS="A;B" ...                     # gpu-lm's XLA_FLAGS sets to try
#
# PARTS: a comma-separated list of the parts below (default: the first six).
# BUDGET: seconds for the whole run (default 560). Parts run in the order
# below, each under its own cap and what is left of the budget: a part that
# overruns is cut and the next still runs; one with under 30 s left is not
# run. OUT (default build/gpu-suite) gets parts.log (what each part took, its
# exit status), host.txt (GPU, driver, commit, torch/jax versions) and
# results.tgz (each part's log and result folder); the parts' Markdown tables
# are printed on stdout too.
#
# By default:
#   fp8-mlp     benchmarks/fp8_gpu.py on the MLP: bf16, fp8 (the default
#               recipe), fp8-bf16-out (Fp8Recipe(gemm_output="bfloat16"))
#               and fp8-fast-all, all with Triton GEMM fusions off (as
#               make_train_step compiles fp8 steps on a GPU); fp8-unpinned:
#               the default recipe without the optimization barrier behind
#               each amax (docs/fp8.md)
#   fp8-forms   benchmarks/fp8_forms.py: one scaled fp8 GEMM of the MLP's
#               shapes in five forms (a float32 or a bf16 result, the scales
#               on the result or as cuBLASLt's operands) against bf16
#   fp8-transpose benchmarks/fp8_transpose.py: a tensor's float8 copy in both
#               layouts (the gradient GEMMs' operands) in six forms
#   fp8-profile benchmarks/fp8_profile.py: the MLP's bf16, fp8 and fp8-unpinned
#               steps under jax.profiler, kernels by name (where fp8's time goes)
#   fp8-gpt2    benchmarks/fp8_gpu.py on GPT-2 small: bf16 against fp8
#   gpu-lm      benchmarks/gpu.py: xla_amp fp16/bf16 (attention through cuDNN's
#               fused kernel) against torch.compile and eager AMP, with
#               torchax's unfused attention (--unfused-attention), and the
#               FLAG_SETS (default: XLA's exhaustive tiling search, the one
#               autotuning set not yet measured; cut by the budget if its
#               compile runs long)
# Only when PARTS names them:
#   composites  scripts/record_cuda_autocast.py: torch.autocast("cuda")'s
#               dtypes for every public function with a sample (the cuda
#               rules' reference, tests/policies/cuda_autocast_dtypes.json;
#               recorded on an H200 with torch 2.11)
#   modules     scripts/record_cuda_autocast.py --modules: the same for every
#               module of PyTorch's module_db (outputs of each submodule,
#               gradients): the reference for a module sweep of the cuda rules
#               (not recorded yet; commit it as tests/policies/cuda_module_dtypes.json)
#   fp8-probe   one fp8 GEMM of the MLP's shape compiled with XLA's defaults
#               and with Triton GEMMs off (55.6 s against 0.11 s on an H200)
#   llm         benchmarks/llm.py: Llama-3-8B's layers (8 of them, seq 4096)
#               by xla_amp bf16 and fp8 against torch.compile bf16, torchao
#               float8 and eager bf16, under 450 s of its own (run it alone:
#               PARTS=llm BUDGET=480)
# torchax, expecttest (torch.testing's OpInfos import it) and torchao (llm's
# torchao-fp8 path; 0.18.0 is torchao's release for torch 2.11) are looked for
# first; one that is missing is installed from its wheel in gpuwheels/, for a
# machine without PyPI. Prepare the folder where there is network access, and
# keep it out of git (third-party code):
#   pip download torchax==0.0.13 expecttest==0.3.0 torchao==0.18.0 --no-deps -d gpuwheels
#   echo /gpuwheels/ >> .git/info/exclude
set -u
OUT=${OUT:-build/gpu-suite}
BUDGET=${BUDGET:-560}
mkdir -p "$OUT"
PY=$(command -v python || command -v python3)
start=$SECONDS

part() {  # NAME CAP COMMAND...
  local name=$1 cap=$2 left t s rc
  shift 2
  if [[ ",${PARTS:-fp8-mlp,fp8-forms,fp8-transpose,fp8-profile,fp8-gpt2,gpu-lm}," != *",$name,"* ]]; then
    return
  fi
  left=$(( BUDGET - (SECONDS - start) ))
  t=$(( cap < left ? cap : left ))
  if (( t < 30 )); then
    echo "$name: not run ($left s left)" >> "$OUT/parts.log"
    return
  fi
  s=$SECONDS
  timeout -k 5 "$t" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc after $(( SECONDS - s )) s (cap $t s)" >> "$OUT/parts.log"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; git rev-parse HEAD; date -u; } \
  > "$OUT/host.txt" 2>&1
for mod in torchax expecttest torchao; do  # expecttest: torch.testing's OpInfos import it
  $PY -c "import $mod" 2>/dev/null || $PY -m pip install -q --no-deps gpuwheels/$mod-*.whl \
    >> "$OUT/pip.log" 2>&1
done
$PY -c "import torch, jax; print(torch.__version__, jax.__version__, jax.devices())" \
  >> "$OUT/host.txt" 2>&1

FLAGS=--xla_gpu_enable_triton_gemm=false  # both variants of each fp8 comparison alike
part fp8-mlp 200 $PY -m benchmarks.fp8_gpu --engines torchax --models mlp \
  --variants bf16,fp8,fp8-bf16-out,fp8-fast-all,fp8-unpinned,fp8-xla-transposes \
  --xla-flags="$FLAGS" --out "$OUT/fp8-mlp"
part fp8-forms 90 $PY -m benchmarks.fp8_forms --out "$OUT/fp8-forms"
part fp8-transpose 90 $PY -m benchmarks.fp8_transpose --out "$OUT/fp8-transpose"
part fp8-profile 150 $PY -m benchmarks.fp8_profile --variants bf16,fp8,fp8-xla-transposes \
  --out "$OUT/fp8-profile"
part fp8-gpt2 150 $PY -m benchmarks.fp8_gpu --engines torchax --models gpt2 \
  --variants bf16,fp8,fp8-bf16-out,fp8-unpinned --rounds 5 --xla-flags="$FLAGS" --out "$OUT/fp8-gpt2"
part gpu-lm 300 $PY -m benchmarks.gpu --only fp16,bf16,eager-amp,compile-amp --unfused-attention \
  --flag-sets="${FLAG_SETS:---xla_gpu_exhaustive_tiling_search=true}" --steps 30 --rounds 3 \
  --out "$OUT/gpu-lm"
part composites 90 $PY -m scripts.record_cuda_autocast --out "$OUT/cuda_autocast_dtypes.json"
part modules 150 $PY -m scripts.record_cuda_autocast --modules --out "$OUT/cuda_module_dtypes.json"
part fp8-probe 60 $PY -m benchmarks.fp8_gpu --worker probe
part llm 480 $PY -m benchmarks.llm --budget 450 --out "$OUT/llm"
echo "total $(( SECONDS - start )) s" >> "$OUT/parts.log"
for f in "$OUT"/*/*.md; do [ -f "$f" ] && { echo "== $f"; cat "$f"; }; done  # the tables, on stdout too
# Three files in $OUT: everything but these two goes into one archive
(cd "$OUT" && tar czf /tmp/gpu-suite-results.tgz --exclude=parts.log --exclude=host.txt . \
  && mv /tmp/gpu-suite-results.tgz results.tgz \
  && find . -mindepth 1 -maxdepth 1 ! -name results.tgz ! -name parts.log ! -name host.txt \
     -exec rm -rf {} +)
cat "$OUT/parts.log"
