"""fwk's correctness on a CUDA GPU, one test per check; ``make gpu-check`` runs each as a part.

Each check builds fwk's own objects as the trainer does (the recipe's config, composed by
fwk; then Precision, Memory, Kernels, the optimizer, Diagnostics and TrainStep, through the
benchmarks' ``engine_step``, benchmarks/common.py) and runs real steps through them.

- ``triton_gpt``: the ``gpt_stdlib`` GPT, built twice from the same init, with ``kernels=triton``
  (Triton LayerNorms, chunked linear cross-entropy) and ``kernels=torch``; one fp32 step on
  the same batch. The losses agree within 1e-5 relative, and every parameter's gradient (as
  the optimizer is handed it) within 1e-4 of that tensor's largest |gradient| (``GRAD_TOL``).
- ``fp16_inf``: ``precision=fp16``: an inf put into one gradient during backward makes the
  GradScaler skip the step (every weight bit-identical), multiply the loss scale by
  ``backoff_factor`` exactly and count one skipped step; the next clean step updates every
  weight tensor and the scale does not back off again.
- ``oom_redo``: ``memory=auto``: a step that runs out of memory is redone on the same batch
  as 2 micro-batches, and its loss and gradients match the unsplit step's (same tolerances
  as ``triton_gpt``). On CUDA the OOM is real: the allocator is capped between the peak of
  the split step and that of the unsplit one (``set_per_process_memory_fraction``).
- ``nvjpeg``: ``data.decode=gpu`` on real JPEGs (crops of scikit-learn's sample photos,
  4:4:4 and 4:2:0): nvJPEG's pixels against the CPU decoder's (libjpeg-turbo), raw and
  through fwk's decode=gpu pipeline against decode=cpu: mean |difference| below 2 levels of
  255 on every file, max |difference| at most 6 levels on 4:4:4 files (7 after resizing).

The CUDA form of each check is marked ``gpu`` and skips without CUDA; it runs at the
recipe's size. triton_gpt, fp16_inf and oom_redo also run on the CPU at a tiny size (2
layers, width 64, 32 tokens; a second or two each), in the suite and in ``make gpu-check
--dry``: triton_gpt under Triton's interpreter (``TRITON_INTERPRET=1``, which
tests/conftest.py sets where there is no CUDA), fp16_inf with fwk's CPU fp16, oom_redo with
an OOM raised by the model's first forward (a simulated one: the CPU has no allocator
limit). nvjpeg needs CUDA. A check that passes prints ``ok: NAME figures``, the line the
gpu-check report shows for its part (it runs pytest with ``-s``).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import os
import tempfile
from pathlib import Path

import pytest
import torch

from benchmarks.common import batch_for, engine_step
from fwk.kernels import available
from tests.conftest import require

TINY = ["model.n_layer=2", "model.n_embd=64", "model.block_size=32", "data.seq_len=32", "train.batch_size=2"]
ON_CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
)
ON_BOTH = pytest.mark.parametrize("where", ["cpu", ON_CUDA])

# fp32 throughout (TF32 off). Both sides of a comparison compute the same sums in another
# order (Triton's row reductions against ATen's, chunked against whole-batch logits, two
# micro-batches against one): each result moves by a few ulps (fp32 eps 1.2e-7), and a
# gradient, a sum over the batch's B*T tokens pushed back through the blocks, by ~1e-6
# of its tensor's scale. 1e-4 leaves ~10x room; a real bug (a wrong mask, mean, weight or
# a lost micro-batch) moves gradients by 1e-2 or more. The loss, a mean of per-token
# logsumexps (~ln 256 = 5.5), moves by ~1e-6 relative.
LOSS_TOL = 1e-5  # relative to the reference loss
GRAD_TOL = 1e-4  # max |d| of a tensor's gradient over that tensor's max |gradient|

# JPEG decoders agree only to the precision the standard asks (ISO 10918-2, IEEE 1180): each
# IDCT output is within 1 of the exact one, so two decoders differ by <= 2 on Y, Cb and Cr;
# YCbCr -> RGB multiplies a chroma error by up to 1.772 (B from Cb) and rounds: <= 2 + 3.54
# + 1 < 7 levels of 255. That holds at 4:4:4. At 4:2:0 the chroma upsampling differs too
# (libjpeg-turbo's triangle filter, nvJPEG's own) and can move a pixel on a sharp colour edge
# by tens of levels, so there only the mean is bounded: torchvision's own test of nvJPEG
# against libjpeg-turbo asks mean |d| < 2 (test_decode_jpeg_cuda). Resizing (bilinear,
# antialiased: non-negative weights, so no larger error) adds a rounding of <= 1 level.
MAX_LEVELS_444 = 6
MEAN_LEVELS = 2.0


def recipe(device, extra: list[str]):
    """The gpt_stdlib recipe's config, composed by fwk; at recipe size on CUDA, tiny on the CPU."""
    from fwk.config.compose import compose
    from fwk.config.validate import to_typed

    tiny = [] if device.type == "cuda" else TINY
    return to_typed(compose(["recipe=gpt_stdlib", *tiny, *extra]))


def handed_grads(step) -> dict:
    """Filled at the step's optimizer call: each parameter's gradient as the optimizer gets it."""
    names = {id(p): n for n, p in step.model.named_parameters()}
    grads: dict = {}

    def keep(optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            grads.update({names[id(p)]: p.grad.detach().clone() for p in group["params"] if p.grad is not None})

    step.optimizer.register_step_pre_hook(keep)
    return grads


def compare(what: str, loss, want_loss, grads: dict, want: dict) -> str:
    """The figures of ``loss``/``grads`` against the reference's; a failure beyond the tolerances."""
    if not want or set(grads) != set(want):
        pytest.fail(f"{what}: gradients differ in which tensors have them: {sorted(set(grads) ^ set(want))}")
    loss, want_loss = float(loss), float(want_loss)
    errs = {}
    for name, ref in want.items():
        err = float((grads[name] - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        errs[name] = err if math.isfinite(err) else math.inf
    worst = max(errs, key=errs.__getitem__)
    d_loss = abs(loss - want_loss)
    figures = (
        f"loss {loss:.6f} vs {want_loss:.6f} (|d| {d_loss:.1e}), max grad rel err {errs[worst]:.1e} "
        f"({worst}) over {len(errs)} tensors"
    )
    if not d_loss <= LOSS_TOL * abs(want_loss) or errs[worst] > GRAD_TOL:
        pytest.fail(f"{what}: {figures}; tolerances: loss {LOSS_TOL:g} relative, gradients {GRAD_TOL:g}")
    return figures


@pytest.fixture(autouse=True)
def _fp32_is_fp32():
    """TF32 matmuls off: fp32 is fp32 in every comparison (PyTorch's default), whatever ran before."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@ON_BOTH
def test_triton_gpt(where: str) -> None:
    """kernels=triton against kernels=torch on the gpt_stdlib GPT: the loss and every gradient."""
    require(available(), "Triton is needed for kernels=triton")
    if where == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU form runs the kernels in Triton's interpreter: TRITON_INTERPRET=1 (set without CUDA)")
    device = torch.device(where)
    runs = {}
    for kernels in ("triton", "torch"):
        cfg = recipe(device, [f"kernels={kernels}", "precision=fp32", "memory=none", "train.grad_clip=0"])
        batch = cfg.train.batch_size
        step, _, _, _, kernel = engine_step(cfg, device, batch)  # seeds torch with cfg.seed first: the same init
        grads = handed_grads(step)
        swapped = sum(type(m).__module__.startswith("fwk.kernels") for m in step.model.modules())
        norms = sum(isinstance(m, torch.nn.LayerNorm) for m in step.model.modules())
        loss = step(0, [batch_for(cfg, batch, device)])
        runs[kernels] = loss, grads, kernel, swapped, norms
    loss, grads, kernels, swapped, norms = runs["triton"]
    if not (kernels.triton and kernels.fused_loss and swapped == norms > 0 and runs["torch"][3] == 0):
        pytest.fail(
            f"kernels=triton did not swap in the kernels: {swapped} of {norms} LayerNorms, fused loss "
            f"{kernels.fused_loss} (kernels=torch: {runs['torch'][3]} swapped)"
        )
    figures = compare("kernels=triton vs torch", loss, runs["torch"][0], grads, runs["torch"][1])
    print(f"ok: triton_gpt ({device.type}, {swapped} Triton LayerNorms + chunked cross-entropy) {figures}")


@ON_BOTH
def test_fp16_inf(where: str) -> None:
    """precision=fp16: a step with an inf gradient is skipped and the loss scale backs off."""
    device = torch.device(where)
    cfg = recipe(device, ["precision=fp16", "memory=none"])
    batch = cfg.train.batch_size
    step, precision, _, _, kernels = engine_step(cfg, device, batch)
    data = [batch_for(cfg, batch, device)]
    params = dict(step.model.named_parameters())
    poisoned, target = list(params.items())[-1]
    armed = [False]

    def poison(grad):  # during backward, before the scaler sees the gradients
        if not armed[0]:
            return None
        grad = grad.clone()
        grad.view(-1)[0] = float("inf")
        return grad

    target.register_hook(poison)
    steps = itertools.count()

    def run(inject: bool) -> tuple[int, float, int]:
        """One step: (weight tensors it changed, loss scale after, skipped steps after)."""
        before = [p.detach().clone() for p in params.values()]
        armed[0] = inject
        step(next(steps), data)
        armed[0] = False
        if not all(bool(p.isfinite().all()) for p in params.values()):
            pytest.fail(f"fp16: non-finite weights after a step (inf injected: {inject})")
        changed = sum(not torch.equal(b, p) for b, p in zip(before, params.values(), strict=True))
        row = precision.metrics()
        return changed, row["loss_scale"], row["skipped_steps"]

    n = len(params)
    # a fresh scaler (init_scale 65536) may overflow on its own at first and back off: that is
    # its calibration, not a failure; the check starts from a clean step that was taken
    for _ in range(4):
        changed, scale, skipped = run(inject=False)
        if changed == n:
            break
    else:
        pytest.fail(f"fp16: no clean step updated all {n} weight tensors in 4 (last {changed}, scale {scale:g})")
    changed_inf, scale_inf, skipped_inf = run(inject=True)
    lowered = scale * cfg.precision.backoff_factor
    if changed_inf or scale_inf != lowered or skipped_inf != skipped + 1:
        pytest.fail(
            f"fp16: step with an inf in {poisoned}'s gradient changed {changed_inf}/{n} weight tensors (want 0), "
            f"loss scale {scale:g} -> {scale_inf:g} (want {lowered:g}), skipped steps {skipped} -> {skipped_inf}"
        )
    changed_after, scale_after, skipped_after = run(inject=False)
    if changed_after != n or scale_after < scale_inf or skipped_after != skipped_inf:
        pytest.fail(
            f"fp16: the clean step after the skipped one changed {changed_after}/{n} weight tensors (want all), "
            f"loss scale {scale_inf:g} -> {scale_after:g}, skipped steps {skipped_inf} -> {skipped_after}"
        )
    print(
        f"ok: fp16_inf ({device.type}, kernels {'triton' if kernels.triton else 'torch'}) inf in {poisoned}'s "
        f"gradient: step skipped (0/{n} weight tensors changed), loss scale {scale:g} -> {scale_inf:g}, skipped "
        f"steps {skipped} -> {skipped_inf}; next clean step changed {changed_after}/{n}, scale {scale_after:g}"
    )


@ON_BOTH
def test_oom_redo(where: str) -> None:
    """memory=auto redoes an out-of-memory step with more micro-batches, with the same gradients."""
    device = torch.device(where)
    cuda = device.type == "cuda"
    # on CUDA a batch whose activations (~2.5 MB a sample at the recipe's size: ~17 x n_embd floats
    # per token per block) dwarf the weights and AdamW state (~7 MB): half a batch, about half the memory
    batch = 1024 if cuda else 4

    def run(memory: list[str], simulate: bool = False):
        """One step of a fresh build (same init, same batch): loss, gradients, the batch sizes
        the model's forward saw, peak allocated bytes, and the memory plan after."""
        cfg = recipe(device, ["precision=fp32", "train.grad_clip=0", f"train.batch_size={batch}", *memory])
        step, _, mem, _, _ = engine_step(cfg, device, batch)
        grads, sizes = handed_grads(step), []

        def seen(module, args) -> None:
            sizes.append(args[0].shape[0])
            if simulate and len(sizes) == 1:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated on the CPU)")

        step.model.register_forward_pre_hook(seen)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        loss = step(0, [batch_for(cfg, batch, device)])
        peak = torch.cuda.max_memory_allocated(device) if cuda else 0
        plan = mem.plan.describe()
        del step, mem
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()  # the next build starts from an empty cache
        return loss, grads, sizes, peak, plan

    want_loss, want, _, whole, _ = run(["memory=none"])
    if cuda:
        _, _, _, half, _ = run(["memory=microbatch", "memory.micro_batches=2"])
        if not half < 0.9 * whole:
            pytest.fail(f"oom: 2 micro-batches peak at {half / 1e9:.3f} GB, the whole batch at {whole / 1e9:.3f} GB")
        cap = (whole + half) / 2  # the whole batch cannot fit, half of it can
        ooms = torch.cuda.memory_stats(device)["num_ooms"]
        torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(device).total_memory, device)
        try:
            loss, grads, sizes, _, plan = run(["memory=auto"])
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        ooms = torch.cuda.memory_stats(device)["num_ooms"] - ooms
        how = f"real OOM: {ooms} under a {cap / 1e9:.3f} GB cap (peaks {whole / 1e9:.3f} / {half / 1e9:.3f} GB)"
    else:
        loss, grads, sizes, _, plan = run(["memory=auto"], simulate=True)
        ooms, how = 1, "simulated OOM on the CPU"
    redo = [batch, batch // 2, batch // 2]
    if ooms < 1 or sizes != redo:
        pytest.fail(f"oom: {ooms} OOMs; the model's forward saw batches {sizes}, want {redo} ({how})")
    figures = compare("oom redo vs unsplit step", loss, want_loss, grads, want)
    print(f"ok: oom_redo ({how}) step of {batch} redone as 2 x {batch // 2} (plan now {plan}); {figures}")


def write_jpegs(root: Path) -> None:
    """Crops of scikit-learn's two sample photos (427 x 640) at odd sizes, JPEG quality 90,
    4:4:4 and 4:2:0 (``444_*``, ``420_*``), as an ImageNet-layout folder of two classes."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    boxes = [(0, 0, 173, 229), (101, 37, 388, 301), (250, 300, 427, 640)]  # (top, left, bottom, right)
    for name, photo in zip(("china", "flower"), load_sample_images().images, strict=True):
        for split, chosen in (("train", boxes), ("val", boxes[1:])):
            folder = root / split / name
            folder.mkdir(parents=True)
            for k, (top, left, bottom, right) in enumerate(chosen):
                crop = Image.fromarray(photo[top:bottom, left:right])
                for tag, subsampling in (("444", 0), ("420", 2)):
                    crop.save(folder / f"{tag}_{k}.JPEG", quality=90, subsampling=subsampling)


def levels(got, want, files: list[str], slack: int, what: str) -> str:
    """Per-file |difference| in levels of 255; a failure beyond the JPEG tolerances (+ ``slack``)."""
    worst = {"444": 0.0, "420": 0.0}
    mean = 0.0
    for a, b, file in zip(got, want, files, strict=True):
        if a.shape != b.shape:
            pytest.fail(f"nvjpeg {what}: {file} is {tuple(a.shape)} on the GPU, {tuple(b.shape)} on the CPU")
        diff = (a.double() - b.double()).abs()
        tag = Path(file).name[:3]
        worst[tag] = max(worst[tag], float(diff.max()))
        mean = max(mean, float(diff.mean()))
        if diff.mean() >= MEAN_LEVELS or (tag == "444" and diff.max() > MAX_LEVELS_444 + slack):
            pytest.fail(
                f"nvjpeg {what}: {file} differs by mean {float(diff.mean()):.2f}, max {float(diff.max()):.0f} "
                f"levels (tolerance mean < {MEAN_LEVELS:g}, max {MAX_LEVELS_444 + slack} at 4:4:4)"
            )
    return f"{what} max {worst['444']:.0f} (4:4:4) / {worst['420']:.0f} (4:2:0), worst mean {mean:.2f} levels"


@pytest.mark.parametrize("where", [ON_CUDA])
def test_nvjpeg(where: str) -> None:
    """data.decode=gpu: nvJPEG's pixels against the CPU decoder's on real JPEGs."""
    from fwk.data.codec import decoders
    from fwk.data.imagefolder import IMAGENET_STD, ImageFolderConfig, imagefolder
    from fwk.data.images import read_bytes

    device = torch.device(where)
    decode_jpeg, _, library = decoders()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_jpegs(root)
        files = sorted(str(p) for p in root.rglob("*.JPEG"))
        data = [read_bytes(f) for f in files]
        on_gpu = decode_jpeg(data, device=device)  # one call for the list, as DecodeOnDevice makes it
        if any(image.device.type != "cuda" for image in on_gpu):
            pytest.fail(f"nvjpeg: decode_jpeg(device={device}) returned images on {on_gpu[0].device}")
        raw = levels([i.cpu() for i in on_gpu], [decode_jpeg(d) for d in data], files, 0, "decode")
        # levels of 255 from the normalized pixels: (x / 255 - mean) / std
        to_levels = 255 * torch.tensor(IMAGENET_STD).view(3, 1, 1)
        figures = [raw]
        gpu, cpu = (
            imagefolder(ImageFolderConfig(root=tmp, image_size=64, val_resize=72, decode=d), seed=0)
            for d in ("gpu", "cpu")
        )
        for split in ("train", "val"):
            items = getattr(gpu, split)
            batch = gpu.collate([items[i] for i in range(len(items))])
            if any(d.dim() != 1 for d in batch[0]):
                pytest.fail(f"nvjpeg: decode=gpu's workers decoded some {split} JPEGs themselves")
            x, y = gpu.finish(batch, device)  # (B, 3, 64, 64) on the GPU
            want = getattr(cpu, split)
            names = [want.path(i) for i in range(len(want))]
            expect = [want[i][0] * to_levels for i in range(len(want))]
            figures.append(levels(list(x.cpu() * to_levels), expect, names, 1, f"decode=gpu {split}"))
            if y.tolist() != [want[i][1] for i in range(len(want))]:
                pytest.fail(f"nvjpeg: decode=gpu's {split} labels {y.tolist()} differ from decode=cpu's")
    print(f"ok: nvjpeg ({library}, {len(files)} files) " + "; ".join(figures))


@ON_BOTH
def test_offload(where: str) -> None:
    """memory=offload: gradients equal memory=none's bit for bit; on CUDA the peak falls, the
    activations waiting in pinned host memory and coming back on the side stream."""
    import torchvision

    from fwk.strategies.offload import Offload

    device = torch.device(where)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(device)
    x, y = torch.randn(32, 3, 64, 64, device=device), torch.randint(0, 10, (32,), device=device)
    ignore = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}

    def grads(off: Offload | None) -> tuple[list[torch.Tensor], int]:
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        hooks = torch.autograd.graph.saved_tensors_hooks(off.pack, off.unpack) if off else contextlib.nullcontext()
        with hooks:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        if off:
            off.close()
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
        return [p.grad.clone() for p in model.parameters()], peak

    grads(None)  # warm-up: cuDNN's choices and workspaces are made once
    expected, plain_peak = grads(None)
    off = Offload(device, ignore)
    got, offload_peak = grads(off)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert off.offloaded_bytes > 10_000_000 and off.hits >= 0.9 * len(off.saved)
    if device.type == "cuda":
        assert offload_peak < 0.8 * plain_peak, (offload_peak, plain_peak)
