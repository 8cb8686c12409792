#!/usr/bin/env bash
# The GPU check behind docs/benchmarks.md's CUDA section: the CUDA tests, then the torch runtime's decode timings on
# the GPU (numpy search, torch adapter converting at the step boundary). Run from the repository root on a machine
# with a CUDA GPU and torch; OUT (default ./gpu-check) receives the logs. Packages the machine lacks can be put as
# wheels in .whl/ (installed into /tmp/site, no network needed).
set -uo pipefail
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch, numpy, onnxruntime as o; print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'onnxruntime', o.__version__, o.get_available_providers())"
    nproc
} 2>&1 | tee "$OUT/machine.txt"

timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu tests/runtimes/test_torch_runtime.py 2>&1 |
    tee "$OUT/gpu_tests.log" | tail -15

for model in acort-xsmall expansionnet-v2; do
    for precision in fp32 fp16; do
        flag=""
        [ "$precision" = fp16 ] && flag="--fp16"
        timeout 120 python3 benchmarks/decode_overhead.py --model "$model" --backend trivial --backend torch \
            --device cuda $flag --batch 1 --batch 8 --batch 32 --beam 3 --steps 20 --warmup 3 --repeats 10 \
            --json "$OUT/overhead_${model}_${precision}.json" 2>&1 | tee "$OUT/overhead_${model}_${precision}.md" | tail -8
    done
done
