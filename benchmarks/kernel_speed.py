"""fwk's Triton kernels against PyTorch eager and torch.compile of the same reference.

    .venv/bin/python -m benchmarks.kernel_speed            # on a CUDA machine: every kernel
    .venv/bin/python -m benchmarks.kernel_speed --vocab 131072 --rows 4096 --width 4096

For each kernel (forward + backward where it has one): the median time of ``rounds``
interleaved calls and the peak memory allocated above what was held before the call, for
triton (fwk/kernels), eager (the reference in PyTorch) and compiled (torch.compile of the
reference). GPU targets: every kernel at least as fast as eager; the chunked linear
cross-entropy <= 0.3x eager's peak memory at vocab 128k.

Without CUDA, Triton kernels only run in the (slow) interpreter, so times would mean
nothing: on CPU the script compares the memory side only where it exists in PyTorch too,
the chunked cross-entropy's PyTorch twin against the full-logits reference (peak RSS).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.common import arguments, machine, peak_rss_during, rss

Case = Callable[[], None]


def _grad_case(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor]) -> Case:
    def run() -> None:
        for t in inputs:
            t.grad = None
        out = fn(*inputs)
        out.backward(torch.ones_like(out) if out.dim() else None)

    return run


def cases(args, device: torch.device) -> dict[str, dict[str, Case]]:
    from fwk.kernels import cross_entropy, layernorm, lion, rmsnorm

    fused_ce = cross_entropy._LinearCrossEntropy.apply
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows, width, vocab = args.rows, args.width, args.vocab

    def make(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device) * scale).to(dtype).requires_grad_()

    x, w, b = make(rows, width), make(width), make(width)
    h, head = make(rows, width), make(vocab, width, scale=0.02)
    target = torch.randint(0, vocab, (rows,), device=device)
    n = args.params
    p, g, m = (torch.randn(n, device=device) for _ in range(3))
    ln_ref = lambda x, w, b: layernorm.reference(x, w, b, 1e-5)  # noqa: E731
    rms_ref = lambda x, w: rmsnorm.reference(x, w, 1e-6)  # noqa: E731
    lion_ref = lambda: lion.reference_step(p, g, m, 1e-4, 0.9, 0.99, 0.1)  # noqa: E731
    compiled = {name: torch.compile(fn) for name, fn in (("ln", ln_ref), ("rms", rms_ref), ("lion", lion_ref))}
    compiled["ce"] = torch.compile(cross_entropy.reference)
    return {
        f"layernorm {rows}x{width}": {
            "triton": _grad_case(lambda x, w, b: layernorm._LayerNorm.apply(x, w, b, 1e-5), [x, w, b]),
            "eager": _grad_case(ln_ref, [x, w, b]),
            "compiled": _grad_case(compiled["ln"], [x, w, b]),
        },
        f"rmsnorm {rows}x{width}": {
            "triton": _grad_case(lambda x, w: rmsnorm._RMSNorm.apply(x, w, 1e-6), [x, w]),
            "eager": _grad_case(rms_ref, [x, w]),
            "compiled": _grad_case(compiled["rms"], [x, w]),
        },
        f"linear cross-entropy {rows}x{width}, vocab {vocab}": {
            "triton": _grad_case(lambda h, w: fused_ce(h, w, target, 0.0, True), [h, head]),
            "eager": _grad_case(lambda h, w: cross_entropy.reference(h, w, target), [h, head]),
            "compiled": _grad_case(lambda h, w: compiled["ce"](h, w, target), [h, head]),
        },
        f"lion step, {n / 1e6:.0f}M params": {
            "triton": lambda: lion.fused_step(p, g, m, 1e-4, 0.9, 0.99, 0.1),
            "eager": lion_ref,
            "compiled": compiled["lion"],
        },
    }


def measure(fn: Case, device: torch.device, rounds: int) -> tuple[float, int]:
    """(median seconds, peak bytes above the memory held before) of one call."""
    fn()  # warm-up: compile, autotune, allocate
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), torch.cuda.max_memory_allocated(device) - before


def gpu(args) -> None:
    device = torch.device("cuda")
    print(f"{machine(device)}; bf16 inputs; median of {args.rounds} calls; memory: peak above what was held before")
    print(f"{'kernel':<46} {'impl':<9} {'ms':>8} {'vs eager':>9} {'peak MB':>9} {'vs eager':>9}")
    for name, impls in cases(args, device).items():
        results = {impl: measure(fn, device, args.rounds) for impl, fn in impls.items()}
        eager_t, eager_m = results["eager"]
        for impl, (t, mem) in results.items():
            print(
                f"{name:<46} {impl:<9} {t * 1000:8.3f} {eager_t / t:8.2f}x {mem / 1e6:9.1f} "
                f"{mem / max(eager_m, 1):8.2f}x"
            )


def cpu_measure(args) -> dict[str, tuple[float, int]]:
    """name -> (seconds, peak RSS bytes above before) of the chunked cross-entropy and the full-logits one."""
    import ctypes

    from fwk.kernels import cross_entropy

    # glibc: return every freed block over 64 KiB to the system at once (M_MMAP_THRESHOLD = -3),
    # so that the resident set size follows live memory
    ctypes.CDLL("libc.so.6").mallopt(-3, 65536)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(args.rows, args.width, generator=g).requires_grad_()
    w = (torch.randn(args.vocab, args.width, generator=g) * 0.02).requires_grad_()
    t = torch.randint(0, args.vocab, (args.rows,), generator=g)
    runs = {
        "full logits": lambda: cross_entropy.reference(h, w, t).backward(),
        "chunked": lambda: cross_entropy._LinearCrossEntropy.apply(h, w, t, 0.0, False).backward(),
    }
    for fn in runs.values():
        fn()  # warm-up
    result = {}
    for name, fn in runs.items():
        base = rss()
        t0 = time.perf_counter()
        peak = peak_rss_during(fn) - base
        result[name] = (time.perf_counter() - t0, peak)
    return result


def cpu(args) -> None:
    print(f"{machine(torch.device('cpu'))}: no CUDA, so Triton kernels would run in the interpreter (no timings).")
    print("The chunked cross-entropy's PyTorch twin against the full-logits reference, forward + backward:")
    result = cpu_measure(args)
    full_t, full_m = result["full logits"]
    for name, (secs, peak) in result.items():
        print(
            f"  {name:<12} {secs * 1000:8.1f} ms ({full_t / secs:.2f}x speed)  peak RSS +{peak / 1e6:7.1f} MB "
            f"({peak / max(full_m, 1):.2f}x of full)   rows {args.rows}, width {args.width}, vocab {args.vocab}"
        )


def rows(quick: bool) -> list:
    """For the harness (make bench): on CPU, the chunked cross-entropy's peak memory vs the full
    logits (one measurement each: a peak, not a timing). On CUDA: every kernel vs eager."""
    from benchmarks.harness import Row, Side, check

    args = arguments(gpt_batch=0, workloads="").parse_args([])
    args.rows, args.width, args.vocab = (256, 64, 4096) if quick else (1024, 256, 32768)
    if torch.cuda.is_available():
        raise RuntimeError("kernels on CUDA: run python -m benchmarks.kernel_speed (not in the harness's table yet)")
    got = cpu_measure(args)
    (ft, fm), (ct, cm) = got["full logits"], got["chunked"]
    r = cm / max(fm, 1)
    size = f"rows {args.rows}, width {args.width}, vocab {args.vocab}"
    return [
        Row(
            "kernels",
            f"chunked linear cross-entropy peak memory ({size})",
            "chunked/full peak RSS",
            r,
            r,
            r,
            Side("chunked", cm / 1e6, "MB"),
            Side("full logits", fm / 1e6, "MB"),
            "<= 0.3x",
            check(r, "<= 0.3x"),
            f"one call each (fwd+bwd); time {ct * 1000:.0f} vs {ft * 1000:.0f} ms; Triton timings need CUDA",
        ),
    ]


def main() -> None:
    parser = arguments(gpt_batch=0, workloads="")
    parser.add_argument("--rows", type=int, default=4096, help="rows (tokens) of the norms and the loss")
    parser.add_argument("--width", type=int, default=4096, help="hidden width")
    parser.add_argument("--vocab", type=int, default=131072, help="vocabulary of the cross-entropy")
    parser.add_argument("--params", type=int, default=100_000_000, help="parameters updated by the Lion step")
    args = parser.parse_args()
    if torch.cuda.is_available() and args.device != "cpu":
        gpu(args)
    else:
        cpu(args)


if __name__ == "__main__":
    main()
