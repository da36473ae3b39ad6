#!/usr/bin/env bash
# FSDP on a GPU machine, one prepared run (a few minutes): ViT-H/14 training steps under DDP and FSDP on every GPU
# (on one GPU FSDP shards over a group of one: its overhead, and the memory estimate against the CUDA allocator's
# peak), then ViT-B/16 the same way. Rows for BENCHMARKS.md, "Sharded training".
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L
python benchmarks/fsdp_step.py --device cuda --models vit_huge_patch14_224 --batch 32 --precision bf16 --rounds 2 --steps 5
python benchmarks/fsdp_step.py --device cuda --models vit_base_patch16_224 --batch 64 --precision bf16 --rounds 2 --steps 5
