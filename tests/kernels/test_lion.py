"""Lion: the fused Triton step equals the PyTorch reference; the optimizer trains."""

from __future__ import annotations

import torch

from tests.kernels import DEVICE

# fp32: the same operations, but the kernel's scalars are fp32 and it may fuse a
# multiply-add: a few ulps apart, never a flipped sign at these values
FP32 = {"rtol": 1e-5, "atol": 1e-6}


def _state(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = 1823 * 7  # not a multiple of the 1024-wide block: the tail is masked
    p, grad, m = (torch.randn(n, generator=g).to(DEVICE, dtype) for _ in range(3))
    grad[:5] = 0.0  # sign(0) = 0 where the interpolation is exactly zero
    m[:5] = 0.0
    return p, grad, m


def test_fused_step_equals_reference_fp32() -> None:
    from fwk.kernels.lion import fused_step, reference_step

    p, grad, m = _state(torch.float32)
    p2, m2 = p.clone(), m.clone()
    for _ in range(3):
        reference_step(p, grad, m, 1e-2, 0.9, 0.99, 0.1)
        fused_step(p2, grad, m2, 1e-2, 0.9, 0.99, 0.1)
    torch.testing.assert_close(p2, p, **FP32)
    torch.testing.assert_close(m2, m, **FP32)


def test_fused_step_fp16_is_the_fp32_step_rounded_once() -> None:
    from fwk.kernels.lion import fused_step, reference_step

    p, grad, m = _state(torch.float16)
    p32, g32, m32 = p.float(), grad.float(), m.float()
    fused_step(p, grad, m, 1e-2, 0.9, 0.99, 0.1)  # computes in fp32, stores fp16
    reference_step(p32, g32, m32, 1e-2, 0.9, 0.99, 0.1)
    # one fp16 rounding of the result: half an ulp, 2^-11 relative
    torch.testing.assert_close(p.float(), p32, rtol=2**-10, atol=1e-6)
    torch.testing.assert_close(m.float(), m32, rtol=2**-10, atol=1e-6)


def test_optimizer_fused_and_reference_agree_and_reduce_the_loss() -> None:
    from fwk.kernels.lion import Lion

    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(37, 29), torch.nn.Tanh(), torch.nn.Linear(29, 3)).to(DEVICE)
    b = torch.nn.Sequential(torch.nn.Linear(37, 29), torch.nn.Tanh(), torch.nn.Linear(29, 3)).to(DEVICE)
    b.load_state_dict(a.state_dict())
    opt_a = Lion(a.parameters(), lr=3e-3, weight_decay=0.1, fused=False)
    opt_b = Lion(b.parameters(), lr=3e-3, weight_decay=0.1, fused=True)
    x, y = torch.randn(64, 37, device=DEVICE), torch.randint(0, 3, (64,), device=DEVICE)
    losses = []
    for _ in range(30):
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        losses.append(loss.item())
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pb, pa, **FP32)
    assert losses[-1] < 0.5 * losses[0]
