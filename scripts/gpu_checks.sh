#!/usr/bin/env bash
# psrv's checks for a machine with an NVIDIA GPU, in one command (no Spark or Java needed):
#
#   bash scripts/gpu_checks.sh [OUT_DIR]
#
# 1. the device tests: every test marked `gpu` (CUDA codec equal to the numba codec byte for byte,
#    decode_many on CUDA equal to the CPU, a CUDA module keeps its parameters there, two workers of the
#    Spark task's own loop on one GPU through a real controller, with one optimizer step a message and
#    with three, `psrv run` of a user's loop on the GPU) and the device test files whole (on a CUDA host
#    their "auto" device paths take the CUDA branch);
# 2. scripts/bench_gpu.py: the device codec against a device copy, the ResNet-18 step with and without
#    sharing (and where the difference goes), batched decode;
# 3. scripts/bench_local_steps.py --device cuda: what a second optimizer step a message costs on the GPU
#    (local_steps="auto" takes two for models up to 500,000 parameters; measured on the CPU only so far);
# 4. scripts/bench_scale.py: one controller and 4, 8 and 14 node processes (where the cores allow),
#    11 M parameters, 100 updates/s per worker, PLAIN and MESH.
#
# Each stage has a deadline and runs whatever the one before it gave; the logs, the JUnit XML and the
# tables go to OUT_DIR (default ./gpu-checks), a summary to stdout at the end. PYTHON picks the
# interpreter (default: .venv/bin/python where it exists, else python3). Stages can be skipped with
# SKIP="scale" (or "tests", "bench", "local"); TEST_DEADLINE_S, BENCH_DEADLINE_S, LOCAL_DEADLINE_S and
# SCALE_DEADLINE_S change the deadlines (seconds); SCALE_ARGS adds arguments to bench_scale.py
# (e.g. "--deadline 60 --modes mesh").
set -u
cd "$(dirname "$0")/.."
out=${1:-gpu-checks}
mkdir -p "$out"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
skip=" ${SKIP:-} "
export PYTHONUNBUFFERED=1
status=0
summary=()

stage() {  # stage NAME DEADLINE_S COMMAND...: run it under a deadline, its output to OUT/NAME.log
  local name=$1 deadline=$2
  shift 2
  if [[ "$skip" == *" $name "* ]]; then
    summary+=("$name: skipped (SKIP)")
    return
  fi
  echo "== $name (deadline ${deadline} s): $*" >&2
  local started=$SECONDS rc
  timeout --kill-after=10 "$deadline" "$@" 2>&1 | tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || status=1
  local why=""
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why=" (deadline)"
  summary+=("$name: exit $rc$why in $((SECONDS - started)) s")
}

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 || true
  echo "cpus: $(nproc)"
  "$PYTHON" - <<'EOF'
import sys
import numba
import numpy
import torch
import zmq

print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"available {torch.cuda.is_available()}, devices {torch.cuda.device_count()}; numpy {numpy.__version__}, "
      f"numba {numba.__version__}, pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}, curve {zmq.has('curve')}")
if torch.cuda.is_available():
    print("device 0:", torch.cuda.get_device_name(0))
EOF
} 2>&1 | tee "$out/environment.log"

device_files=(tests/unit/test_encoding_device.py tests/unit/test_nn_torch_device.py
              tests/unit/test_local_workers.py tests/unit/test_torch_optimizer.py)
stage tests "${TEST_DEADLINE_S:-420}" "$PYTHON" -m pytest -p no:cacheprovider -q -rs \
  --junitxml="$out/tests.xml" "${device_files[@]}" \
  tests/integration/test_replica_invariant.py::test_two_workers_on_one_device_keep_the_invariant_and_learn_as_one_process \
  tests/integration/test_replica_invariant.py::test_several_optimizer_steps_a_message_keep_the_invariant_on_every_step_path \
  tests/integration/test_torch_launch.py::test_psrv_run_trains_a_users_own_loop_on_the_gpu
stage bench "${BENCH_DEADLINE_S:-300}" "$PYTHON" scripts/bench_gpu.py
stage local "${LOCAL_DEADLINE_S:-180}" "$PYTHON" scripts/bench_local_steps.py --device cuda --local-steps 2 \
  --models cnn,mlp400k,mlp1m,mlp11m
stage scale "${SCALE_DEADLINE_S:-420}" "$PYTHON" scripts/bench_scale.py --rate 100 --updates 300 \
  --generator-seconds 1 --json "$out/scale.json" ${SCALE_ARGS:-}

printf '%s\n' "" "summary:" "${summary[@]}" | tee "$out/summary.log"
exit $status
