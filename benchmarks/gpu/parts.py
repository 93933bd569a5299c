"""The parts of ``make gpu-check``, in the order they run, with their budgets.

On one GPU the budgets add up to 10 minutes (8 before resnet50-tta, the ResNet-50 headline
run, which needs its own photos and three whole runs): correctness first, since a
wrong kernel makes every speed figure after it meaningless, then the speed and memory
ratios, then the whole ``fwk train`` against a plain loop. Each part names its ``--dry``
form: the same code on the CPU at tiny sizes (precision and jit on the digits CNN, memory on
the 8-layer GPT: the GPU's ResNet-50 takes minutes there), or None where the part means
nothing without CUDA (the compiled Triton kernels' tests and timings, nvJPEG); ``--dry``
reports those as skipped, by name. The correctness checks are the tests of
tests/gpu/test_correct.py: each part runs its check's CUDA form (marked ``gpu``) and, with
``--dry``, its CPU form (the same check at a tiny size; the Triton kernels in Triton's
interpreter, the fp16 check with fwk's CPU fp16, the OOM simulated).
The budgets are estimates until a GPU run measures them.
"""

from __future__ import annotations

import sys

from benchmarks.gpu.part import Part

PY = sys.executable
FWK = [PY, "-m", "fwk"]
# The CUDA-only tests of the suite (they skip on a CPU): the kernels compiled, not interpreted;
# --format tensorrt built, reloaded and timed against aoti (skipped where torch-tensorrt is missing)
CUDA_TESTS = [
    "tests/kernels",
    "tests/data/test_gpu_decode.py",
    "tests/data/test_prefetch.py",
    "tests/export/test_tensorrt.py",
]
PYTEST = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-W", "ignore::DeprecationWarning"]
TINY = ["--device", "cpu", "--image-size", "32", "--batch", "2", "--gpt-batch", "2", "--rounds", "1"]
FULL = ["--device", "cuda", "--image-size", "224", "--batch", "128", "--gpt-batch", "32"]
CORRECT = "tests/gpu/test_correct.py"
# pytest cuts a summary line to the terminal's width (80 columns in a pipe), and drops the
# reason of a failure that does not fit: the report's result column wants the whole line
WIDE = {"COLUMNS": "1000"}


def bench(module: str) -> list[str]:
    """One module of the benchmarks package run alone: ``bench("gpu.whole")`` is ``python -m benchmarks.gpu.whole``."""
    return [PY, "-m", f"benchmarks.{module}"]


def correct(check: str, dry: bool = False) -> list[str]:
    """pytest on one check of tests/gpu/test_correct.py: its CUDA form (marked gpu), or with
    ``dry`` its CPU form. ``-s`` lets its ``ok:`` line through; ``-rfEs`` sums up why it failed or skipped."""
    return [*PYTEST, "-s", "-rfEs", "-m", "not gpu" if dry else "gpu", f"{CORRECT}::test_{check}"]


PARTS = [
    Part("doctor", "doctor", "versions, device, capability, free memory, NCCL", 15, [*FWK, "doctor"],
         [*FWK, "doctor"], 30),
    # --- correctness ---
    Part("cuda-tests", "correctness", "the suite's CUDA tests: Triton kernels, nvJPEG, prefetcher, TensorRT export", 40,
         [*PYTEST, *CUDA_TESTS], None, env=WIDE),
    Part("triton-gpt", "correctness", "kernels=triton vs kernels=torch on the GPT: loss and gradients", 25,
         correct("triton_gpt"), correct("triton_gpt", dry=True), 90, env=WIDE,
         dry_env={"TRITON_INTERPRET": "1"}),  # read when a kernel is defined: set before pytest starts
    Part("fp16-inf", "correctness", "fp16 with an injected inf skips the step and lowers the scale", 15,
         correct("fp16_inf"), correct("fp16_inf", dry=True), 60, env=WIDE),
    Part("oom-redo", "correctness", "a forced OOM is redone with more micro-batches on the same data", 25,
         correct("oom_redo"), correct("oom_redo", dry=True), 60, env=WIDE),
    Part("nvjpeg", "correctness", "data.decode=gpu equals the CPU decode within JPEG tolerance", 15,
         correct("nvjpeg"), None, env=WIDE),
    Part("layouts", "correctness", "tp=2, pp=2 and tp=2 x dp_shard=2 over NCCL equal one process (2 and 4 GPUs)",
         20, bench("gpu.layouts"), [*bench("gpu.layouts"), "--dry"], 300),
    # --- speed and memory, as ratios measured in one run ---
    Part("precision", "speed", "fp32/TF32, bf16, fp16 and auto on ResNet-50 (224 px, batch 128) and the GPT", 35,
         [*bench("precision"), *FULL, "--rounds", "5", "--workloads", "resnet50,gpt"],
         [*bench("precision"), *TINY, "--workloads", "digits"], 90),
    Part("jit", "speed", "jit=auto and jit=compile against eager", 40,
         [*bench("jit"), *FULL, "--batch", "64", "--rounds", "5", "--workloads", "gpt,resnet50"],
         [*bench("jit"), *TINY, "--workloads", "digits"], 150),
    Part("kernels", "speed", "Triton kernels vs eager and torch.compile; fused cross-entropy peak at vocab 128k",
         25, bench("kernel_speed"), None),
    Part("memory", "speed", "activation checkpointing and micro-batches: peak memory against step time", 25,
         [*bench("memory"), *FULL, "--rounds", "3", "--workloads", "resnet50,gpt8"],
         [*bench("memory"), *TINY, "--gpt-batch", "4", "--workloads", "gpt8"], 120),  # 4: 4 micro-batches
    Part("ddp-fsdp", "speed", "DDP against FSDP on one device: samples/s and peak memory", 25,
         bench("gpu.ddp_fsdp"), [*bench("gpu.ddp_fsdp"), "--dry", "--reps", "1"], 120),
    Part("decode", "speed", "the 224 px image pipeline: torchvision, fwk folder, shards; data.decode=gpu", 25,
         [*bench("gpu.bench_rows"), "decode", "--images", "600", "--workers", "8", "--no-s3"],
         [*bench("gpu.bench_rows"), "decode", "--images", "160", "--rounds", "1", "--no-s3"], 120),
    Part("tta", "speed", "gpt_stdlib and gpt_stdlib_fast to target, cold and warm, vs a plain bf16-autocast loop", 50,
         [*bench("gpu.bench_rows"), "tta", "gpt_stdlib", "--device", "cuda", "--reps", "1", "--no-tune"],
         [*bench("gpu.bench_rows"), "tta", "digits_cnn", "--quick", "--reps", "1", "--no-tune"], 120),
    # --- the whole command, auto everything, against a plain loop with the same model and AMP ---
    Part("whole-resnet50", "whole", "fwk train resnet50_imagenet data=synthetic, 100 steps, vs a plain AMP loop",
         60, [*bench("gpu.whole"), "resnet50", "--reps", "1"],
         [*bench("gpu.whole"), "resnet50", "--dry", "--reps", "1"], 150),
    Part("whole-gpt", "whole", "fwk train gpt_stdlib vs a plain AMP loop", 60,
         [*bench("gpu.whole"), "gpt", "--reps", "1"],
         [*bench("gpu.whole"), "gpt", "--dry", "--reps", "1"], 150),
    Part("resnet50-tta", "whole", "ResNet-50 on 2,000 real photos to val acc 0.95: plain bf16 loop, fwk, fwk fast",
         100, [*bench("gpu.bench_rows"), "resnet50", "--device", "cuda"],
         [*bench("gpu.bench_rows"), "resnet50", "--quick"], 120),
]  # fmt: skip
