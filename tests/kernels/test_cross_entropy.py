"""Chunked linear cross-entropy against the full-logits reference: loss and gradients,
the Triton kernel and its PyTorch twin, with label smoothing, an irregular vocabulary."""

from __future__ import annotations

import pytest
import torch

from tests.kernels import DEVICE

# Loss: a mean of 257 per-row losses summed in another order, and an online (chunked)
# log-sum-exp: a few fp32 ulps. Gradients of the weight sum 257 rows in chunks: ~1e-6.
FP32 = {"rtol": 1e-5, "atol": 1e-6}
# fp16 hidden/weight: the logits matmul rounds to fp16 (2^-11 relative) before the fp32 softmax
FP16 = {"rtol": 2e-2, "atol": 2e-3}


def _case(dtype: torch.dtype, rows: int = 257, width: int = 48, vocab: int = 5003):
    g = torch.Generator().manual_seed(7)
    h = torch.randn(rows, width, generator=g).to(DEVICE, dtype).requires_grad_()
    w = (torch.randn(vocab, width, generator=g) * 0.2).to(DEVICE, dtype).requires_grad_()
    t = torch.randint(0, vocab, (rows,), generator=g).to(DEVICE)
    return h, w, t


@pytest.mark.parametrize("use_triton", [True, False], ids=["triton", "torch-twin"])
@pytest.mark.parametrize("dtype,smoothing", [(torch.float32, 0.0), (torch.float32, 0.1), (torch.float16, 0.0)])
def test_matches_full_logits_reference(use_triton: bool, dtype: torch.dtype, smoothing: float) -> None:
    from fwk.kernels import cross_entropy

    h, w, t = _case(dtype)
    loss = cross_entropy._LinearCrossEntropy.apply(h, w, t, smoothing, use_triton)
    (loss * 3.0).backward()  # a non-unit upstream gradient: backward must scale
    gh, gw = h.grad, w.grad
    rh, rw = (x.detach().float().requires_grad_() for x in (h, w))
    want = cross_entropy.reference(rh, rw, t, smoothing)
    (want * 3.0).backward()
    tol = FP32 if dtype == torch.float32 else FP16
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want, **tol)
    torch.testing.assert_close(gh.float(), rh.grad, **tol)
    torch.testing.assert_close(gw.float(), rw.grad, **tol)


def test_chunks_keep_logits_small() -> None:
    from fwk.kernels.cross_entropy import chunk_rows

    # 8192 rows x 128k vocab x 4096 wide: 256 rows per chunk, 1/32 of the full logits
    assert chunk_rows(8192, 131072, 4096) == 256
    assert chunk_rows(10, 256, 128) == 5  # small vocabularies: few, large chunks
