"""Channels-last under FSDP: does keeping conv weights contiguous lose the NHWC speed?

    .venv/bin/python -m benchmarks.channels_last [--rounds 7] [--image-size 64] [--batch 16]
    .venv/bin/python -m benchmarks.channels_last --device cuda --image-size 224 --batch 128

FSDP2 shards contiguous parameters only (``fwk/strategies/fsdp.py``), so under FSDP the conv
weights stay contiguous and only the inputs are made channels-last. Three layouts of one
ResNet-50 training step (forward, backward, SGD), each in fp32 and under bf16 autocast,
timed interleaved:
- ``nchw``: contiguous weights and inputs (channels-last off);
- ``nhwc``: channels-last weights and inputs (what one process and DDP run);
- ``nhwc-input``: contiguous weights, channels-last inputs (what FSDP runs).
Target: ``nhwc-input`` within 5% of ``nhwc``. The activations' format is printed too: a
channels-last input must give channels-last activations whatever the weights' format.
"""

from __future__ import annotations

import statistics

import torch
import torchvision

from benchmarks.common import arguments, device_arg, interleaved_times, machine

LAYOUTS = {  # name -> (weights channels-last, inputs channels-last)
    "nchw": (False, False),
    "nhwc": (True, True),
    "nhwc-input": (False, True),
}


def _step(device: torch.device, dtype: torch.dtype | None, weights_cl: bool, input_cl: bool, batch: int, size: int):
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=100).to(device)
    if weights_cl:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g).to(device)
    y = torch.randint(0, 100, (batch,), generator=g).to(device)
    if input_cl:
        x = x.contiguous(memory_format=torch.channels_last)
    seen: list[bool] = []
    hook = model.layer1.register_forward_hook(
        lambda m, i, out: seen.append(out.is_contiguous(memory_format=torch.channels_last))
    )

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: oneDNN/cuDNN pick and cache their kernels
    hook.remove()
    return step, seen[0]


def measure(args, dtype: torch.dtype | None) -> tuple[dict[str, list[float]], dict[str, bool]]:
    device = device_arg(args.device)
    steps, nhwc_out = {}, {}
    for name, (weights_cl, input_cl) in LAYOUTS.items():
        steps[name], nhwc_out[name] = _step(device, dtype, weights_cl, input_cl, args.batch, args.image_size)
    return interleaved_times(steps, args.rounds, device), nhwc_out


def rows(quick: bool) -> list:
    """For the harness (make bench): per format, each layout's step time as a ratio to ``nhwc``."""
    from benchmarks.common import option_rows
    from benchmarks.harness import guarded

    args = arguments(gpt_batch=0, workloads="").parse_args([])
    args.image_size, args.batch, args.rounds = (32, 2, 3) if quick else (32, 8, 7)

    def one(dtype: torch.dtype | None) -> list:
        times, nhwc_out = measure(args, dtype)
        note = "activations channels-last: " + ", ".join(f"{n} {'yes' if v else 'no'}" for n, v in nhwc_out.items())
        what = f"resnet50 {'bf16' if dtype else 'fp32'} ({args.image_size} px, batch {args.batch})"
        return option_rows("channels_last", what, times, "nhwc", note, {"nhwc-input": "<= 1.05x"})

    return [r for dt in (None, torch.bfloat16) for r in guarded("channels_last", str(dt), lambda dt=dt: one(dt))]


def main() -> None:
    parser = arguments(gpt_batch=0, workloads="")
    parser.set_defaults(rounds=7)
    args = parser.parse_args()
    device = device_arg(args.device)
    for dtype in (None, torch.bfloat16):
        times, nhwc_out = measure(args, dtype)
        medians = {n: statistics.median(ts) for n, ts in times.items()}
        fmt = "bf16 autocast" if dtype else "fp32"
        print(f"\nresnet50 {fmt} ({args.image_size} px, batch {args.batch}), {machine(device)}")
        print(f"median of {args.rounds} interleaved steps")
        print(f"{'layout':<11} {'ms/step':>9} {'vs nhwc':>8}  activations channels-last")
        for name in LAYOUTS:
            ratio = medians[name] / medians["nhwc"]
            print(f"{name:<11} {medians[name] * 1000:9.1f} {ratio:7.2f}x  {'yes' if nhwc_out[name] else 'no'}")


if __name__ == "__main__":
    main()
