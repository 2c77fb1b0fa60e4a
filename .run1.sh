#!/bin/bash
# Device run 1: make test cold and warm (timeline), then the bench modes.
O=$OUT
cd "$(dirname "$0")"
git log --oneline -1 > $O/tree.txt 2>&1; git status --short >> $O/tree.txt 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $O/gpu.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $O/gpu.txt 2>&1
export TRITON_CACHE_DIR=$(mktemp -d)
for pass in cold warm; do
  s=$(date +%s)
  KVFP8_TIMELINE=$O/timeline-$pass.txt timeout 280 make test PYTEST_ARGS="-p no:cacheprovider --durations=30" > $O/test-$pass.log 2>&1
  rc=$?; e=$(date +%s); echo "rc=$rc wall=$((e-s))s" >> $O/test-$pass.log
  python3 -m tools.timeline $O/timeline-$pass.txt --slowest 15 > $O/timeline-$pass.sum 2>&1
done
mkdir -p $O/bench
OUT=$O/bench timeout 150 python3 -m tools.bench --tokens 1,32768 --heads-dims 8x128,4x256 --recipes unfused --no-reference --no-plot --no-host --rep-ms 10 > $O/bench.log 2>&1
echo "bench rc=$?" >> $O/bench.log
