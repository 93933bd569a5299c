"""The parts of ``make gpu-check``, in the order they run, with their budgets.

On one GPU the budgets add up to 10 minutes (8 before resnet50-tta, the ResNet-50 headline
run, which needs its own photos and three whole runs): correctness first, since a
wrong kernel makes every speed figure after it meaningless, then the speed and memory
ratios, then the whole ``fwk train`` against a plain loop. Each part names its ``--dry``
form: the same code on the CPU at tiny sizes (precision and jit on the digits CNN, memory on
the 8-layer GPT: the GPU's ResNet-50 takes minutes there), or None where the part means
nothing without CUDA (the compiled Triton kernels' tests and timings); ``--dry`` reports those as skipped, by
name, and nvjpeg's dry form reports itself skipped (the OOM and fp16 checks run on the CPU).
The budgets are estimates until a GPU run measures them.
"""

from __future__ import annotations

import sys

from check import Part

PY = sys.executable
FWK = [PY, "-m", "fwk"]
BENCH = "scripts/bench"
GPU = "scripts/gpu"
# The CUDA-only tests of the suite (they skip on a CPU): the kernels compiled, not interpreted
CUDA_TESTS = ["tests/kernels", "tests/data/test_gpu_decode.py", "tests/data/test_prefetch.py"]
PYTEST = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-W", "ignore::DeprecationWarning"]
TINY = ["--device", "cpu", "--image-size", "32", "--batch", "2", "--gpt-batch", "2", "--rounds", "1"]
FULL = ["--device", "cuda", "--image-size", "224", "--batch", "128", "--gpt-batch", "32"]

PARTS = [
    Part("doctor", "doctor", "versions, device, capability, free memory, NCCL", 15, [*FWK, "doctor"],
         [*FWK, "doctor"], 30),
    # --- correctness ---
    Part("cuda-tests", "correctness", "the suite's CUDA tests: Triton kernels compiled, nvJPEG, prefetcher", 40,
         [*PYTEST, *CUDA_TESTS], None),
    Part("triton-gpt", "correctness", "kernels=triton vs kernels=torch on the GPT: loss and gradients", 25,
         [PY, f"{GPU}/correct.py", "triton_gpt"], [PY, f"{GPU}/correct.py", "triton_gpt", "--dry"], 90),
    Part("fp16-inf", "correctness", "fp16 with an injected inf skips the step and lowers the scale", 15,
         [PY, f"{GPU}/correct.py", "fp16_inf"], [PY, f"{GPU}/correct.py", "fp16_inf", "--dry"], 60),
    Part("oom-redo", "correctness", "a forced OOM is redone with more micro-batches on the same data", 25,
         [PY, f"{GPU}/correct.py", "oom_redo"], [PY, f"{GPU}/correct.py", "oom_redo", "--dry"], 60),
    Part("nvjpeg", "correctness", "data.decode=gpu equals the CPU decode within JPEG tolerance", 15,
         [PY, f"{GPU}/correct.py", "nvjpeg"], [PY, f"{GPU}/correct.py", "nvjpeg", "--dry"], 60),
    Part("layouts", "correctness", "tp=2, pp=2 and tp=2 x dp_shard=2 over NCCL equal one process (2 and 4 GPUs)",
         20, [PY, f"{GPU}/layouts.py"], [PY, f"{GPU}/layouts.py", "--dry"], 300),
    # --- speed and memory, as ratios measured in one run ---
    Part("precision", "speed", "fp32/TF32, bf16, fp16 and auto on ResNet-50 (224 px, batch 128) and the GPT", 35,
         [PY, f"{BENCH}/precision.py", *FULL, "--rounds", "5", "--workloads", "resnet50,gpt"],
         [PY, f"{BENCH}/precision.py", *TINY, "--workloads", "digits"], 90),
    Part("jit", "speed", "jit=auto and jit=compile against eager", 40,
         [PY, f"{BENCH}/jit.py", *FULL, "--batch", "64", "--rounds", "5", "--workloads", "gpt,resnet50"],
         [PY, f"{BENCH}/jit.py", *TINY, "--workloads", "digits"], 150),
    Part("kernels", "speed", "Triton kernels vs eager and torch.compile; fused cross-entropy peak at vocab 128k",
         25, [PY, f"{BENCH}/kernel_speed.py"], None),
    Part("memory", "speed", "activation checkpointing and micro-batches: peak memory against step time", 25,
         [PY, f"{BENCH}/memory.py", *FULL, "--rounds", "3", "--workloads", "resnet50,gpt8"],
         [PY, f"{BENCH}/memory.py", *TINY, "--gpt-batch", "4", "--workloads", "gpt8"], 120),  # 4: 4 micro-batches
    Part("ddp-fsdp", "speed", "DDP against FSDP on one device: samples/s and peak memory", 25,
         [PY, f"{GPU}/ddp_fsdp.py"], [PY, f"{GPU}/ddp_fsdp.py", "--dry", "--reps", "1"], 120),
    Part("decode", "speed", "the 224 px image pipeline: torchvision, fwk folder, shards; data.decode=gpu", 25,
         [PY, f"{GPU}/bench_rows.py", "decode", "--images", "600", "--workers", "8", "--no-s3"],
         [PY, f"{GPU}/bench_rows.py", "decode", "--images", "160", "--rounds", "1", "--no-s3"], 120),
    Part("tta", "speed", "gpt_stdlib and gpt_stdlib_fast to target, cold and warm, vs a plain bf16-autocast loop", 50,
         [PY, f"{GPU}/bench_rows.py", "tta", "gpt_stdlib", "--device", "cuda", "--reps", "1", "--no-tune"],
         [PY, f"{GPU}/bench_rows.py", "tta", "digits_cnn", "--quick", "--reps", "1", "--no-tune"], 120),
    # --- the whole command, auto everything, against a plain loop with the same model and AMP ---
    Part("whole-resnet50", "whole", "fwk train resnet50_imagenet data=synthetic, 100 steps, vs a plain AMP loop",
         60, [PY, f"{GPU}/whole.py", "resnet50", "--reps", "1"],
         [PY, f"{GPU}/whole.py", "resnet50", "--dry", "--reps", "1"], 150),
    Part("whole-gpt", "whole", "fwk train gpt_stdlib vs a plain AMP loop", 60,
         [PY, f"{GPU}/whole.py", "gpt", "--reps", "1"],
         [PY, f"{GPU}/whole.py", "gpt", "--dry", "--reps", "1"], 150),
    Part("resnet50-tta", "whole", "ResNet-50 on 2,000 real photos to val acc 0.95: plain bf16 loop, fwk, fwk fast",
         100, [PY, f"{GPU}/bench_rows.py", "resnet50", "--device", "cuda"],
         [PY, f"{GPU}/bench_rows.py", "resnet50", "--quick"], 120),
]  # fmt: skip
