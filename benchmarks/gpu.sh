#!/usr/bin/env bash
# The GPU check, one prepared run (under 8 minutes on one GPU): every attention backend against the reference on
# ViT, Swin, DETR and Deformable DETR (forward and backward, float64, fp32 and bf16), capture with the fused kernels
# on, and ViT-B/16 against timm and DETR-R50 against transformers (inference and a training step, bf16); then where
# DETR-R50's training step spends its host time (gpu_step_profile.py: waits, and each part's launches). Rows for
# BENCHMARKS.md, "On a GPU". Its CPU dry run (`python benchmarks/gpu.py --dry-run`) is in the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L
status=0
HF_HUB_OFFLINE=1 python benchmarks/gpu.py --device cuda --out gpu.json "$@" || status=$?
python benchmarks/gpu_step_profile.py --compare none || status=$?
exit "$status"
