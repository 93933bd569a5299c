"""data.decode=gpu: workers read bytes, the training process decodes a batch at once and
augments it. Its pieces run on any device: on the CPU they must give decode=cpu's images
exactly (same decoder, same seeded crops); on CUDA (nvJPEG), close to them."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from fwk.data.gpu_decode import NO_SEED, DecodeOnDevice, EncodedImages, collate
from fwk.data.prefetch import DevicePrefetcher
from fwk.errors import UserError
from tests.data.test_imagefolder import build, write_tree

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")


@pytest.fixture
def bundle(tmp_path):
    root = write_tree(tmp_path / "imagenet")
    png = root / "train" / "dog" / "dog_1.JPEG"  # a PNG named .JPEG: decoded by the worker
    Image.open(png).convert("RGB").save(png, "PNG")
    return build(root, seed=4)


def _pipeline(bundle, split, indices, device):
    dataset = getattr(bundle, split)
    finish = DecodeOnDevice(bundle.train.transform, bundle.val.transform)
    batch = collate([EncodedImages(dataset)[i] for i in indices])
    return batch, finish(batch, device)


def test_workers_send_jpeg_bytes_and_decoded_other_formats(bundle):
    (data, labels, seeds), _ = _pipeline(bundle, "train", range(12), torch.device("cpu"))
    assert [d.dim() for d in data] == [1] * 5 + [3] + [1] * 6  # item 5 is dog_1: the PNG
    assert labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert len(set(seeds.tolist())) == 12 and NO_SEED not in seeds.tolist()


@pytest.mark.parametrize("split", ["train", "val"])
def test_on_the_cpu_it_gives_decode_cpus_images_exactly(bundle, split):
    dataset = getattr(bundle, split)
    dataset.set_epoch(3)
    indices = range(len(dataset))
    _, (x, y) = _pipeline(bundle, split, indices, torch.device("cpu"))
    assert x.shape == (len(dataset), 3, 32, 32) and x.dtype == torch.float32
    assert torch.equal(x, torch.stack([dataset[i][0] for i in indices]))
    assert y.tolist() == [dataset[i][1] for i in indices]


def test_prefetcher_finishes_batches(bundle):
    loader = torch.utils.data.DataLoader(EncodedImages(bundle.train), batch_size=4, collate_fn=collate)
    finish = DecodeOnDevice(bundle.train.transform, bundle.val.transform)
    x, y = next(DevicePrefetcher(iter(loader), torch.device("cpu"), finish))
    assert torch.equal(x, torch.stack([bundle.train[i][0] for i in range(4)])) and y.tolist() == [0] * 4


def test_gpu_decode_without_cuda_is_one_line(tmp_path, monkeypatch):
    from fwk.data.imagefolder import ImageFolderConfig, imagefolder

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    root = write_tree(tmp_path / "imagenet")
    with pytest.raises(UserError, match="data.decode=gpu .* use data.decode=cpu"):
        imagefolder(ImageFolderConfig(root=str(root), decode="gpu"), seed=0)
    with pytest.raises(UserError, match="data.decode='nvjpeg' is not allowed"):
        imagefolder(ImageFolderConfig(root=str(root), decode="nvjpeg"), seed=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (nvJPEG)")
def test_on_cuda_nvjpeg_gives_images_close_to_decode_cpu(bundle):
    dataset = bundle.train
    _, (x, y) = _pipeline(bundle, "train", range(12), torch.device("cuda"))
    assert x.device.type == "cuda" and y.device.type == "cuda"
    want = torch.stack([dataset[i][0] for i in range(12)])
    # nvJPEG's IDCT and chroma upsampling differ from libjpeg-turbo's by a few levels of 255,
    # and the GPU's antialiased resize rounds differently: a few hundredths after normalizing
    # (1/255/0.225 = 0.017 per level); the same crops, so never a whole other image.
    diff = (x.cpu() - want).abs()
    assert diff.mean() < 0.05 and diff.max() < 0.5
