#!/usr/bin/env bash
# One device call: regenerate the realistic stage-1 golden outputs (exact input generator, TileLang 0.1.8) and run
# the whole op upstream for the extra cases, checking the capture against the stored whole-op golden data.
# Usage on the GPU machine (repository root, wheelhouse/ carried): bash golden/device_golden_run.sh OUT_DIR
set -uo pipefail
out=${1:?usage: device_golden_run.sh OUT_DIR}
export PYTHONUNBUFFERED=1
. scripts/use_upstream_wheels.sh wheelhouse /tmp/site || exit 2
python -c "import tilelang, torch; print('tilelang', tilelang.__version__, 'torch', torch.__version__)"
nvidia-smi -L
(python golden/make_golden.py --out /tmp/realistic --sets realistic --no-golden --jobs 6 > "$out/realistic.log" 2>&1 \
   && python golden/pack_realistic_golden.py /tmp/realistic "$out/upstream_h200_realistic_outputs.pt" \
   >> "$out/realistic.log" 2>&1; echo "realistic exit $?" >> "$out/realistic.log") &
python golden/make_golden_full_op.py --out "$out/upstream_h200_full_op_extra_cases.pt" --jobs 10 --sass /tmp/sass \
  --report "$out/full_op_report.json" > "$out/full_op.log" 2>&1
echo "full op exit $?" >> "$out/full_op.log"
wait
tar -C /tmp -cJf "$out/sass.tar.xz" sass 2>/dev/null
tail -5 "$out/realistic.log"; tail -40 "$out/full_op.log"
