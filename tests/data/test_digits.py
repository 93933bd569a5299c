import torch

from fwk.data.digits import DigitsConfig, digits


def test_sizes_and_types():
    b = digits(DigitsConfig(), seed=0)
    assert (len(b.train), len(b.val)) == (1497, 300)
    assert (b.task, b.num_classes) == ("classification", 10)
    x, y = b.train[0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32
    assert y.dtype == torch.int64


def test_split_ignores_run_seed_and_is_deterministic():
    a, b = digits(DigitsConfig(), seed=0), digits(DigitsConfig(), seed=123)
    for sa, sb in ((a.train, b.train), (a.val, b.val)):
        for ta, tb in zip(sa.tensors, sb.tensors, strict=True):
            assert torch.equal(ta, tb)


def test_split_seed_changes_split():
    a, b = digits(DigitsConfig(split_seed=0), seed=0), digits(DigitsConfig(split_seed=1), seed=0)
    assert not torch.equal(a.val.tensors[0], b.val.tensors[0])


def test_unnormalized_range_and_normalized_stats():
    raw = digits(DigitsConfig(normalize=False), seed=0)
    assert raw.train.tensors[0].min() == 0 and raw.train.tensors[0].max() == 1
    norm = digits(DigitsConfig(), seed=0).train.tensors[0]
    # train stats are exactly what was subtracted/divided: 1e-4 covers float32 summation error
    assert abs(norm.mean().item()) < 1e-4 and abs(norm.std().item() - 1) < 1e-4


def test_upscaled_images_keep_split_and_stats():
    small, big = digits(DigitsConfig(), seed=0), digits(DigitsConfig(image_size=32), seed=0)
    x, y = big.train[0]
    assert x.shape == (1, 32, 32) and torch.equal(big.train.tensors[1], small.train.tensors[1])
    norm = big.train.tensors[0]
    assert abs(norm.mean().item()) < 1e-4 and abs(norm.std().item() - 1) < 1e-4


def test_image_size_below_8_is_refused():
    import pytest

    from fwk.errors import UserError

    with pytest.raises(UserError, match="data.image_size=4 must be >= 8"):
        digits(DigitsConfig(image_size=4), seed=0)


def test_the_images_and_labels_are_scikit_learns():
    """fwk reads scikit-learn's file itself (importing sklearn costs every run ~2 s): the
    same pixels and labels as load_digits, in the file's order before the split."""
    from sklearn.datasets import load_digits

    ref = load_digits()
    b = digits(DigitsConfig(normalize=False, val_size=1), seed=0)
    perm = torch.randperm(1797, generator=torch.Generator().manual_seed(0))  # split_seed 0: val first
    order = torch.cat([perm[1:], perm[:1]])
    images = torch.cat([b.train.tensors[0], b.val.tensors[0]])
    labels = torch.cat([b.train.tensors[1], b.val.tensors[1]])
    assert torch.equal(images, torch.as_tensor(ref.images, dtype=torch.float32)[order].unsqueeze(1) / 16.0)
    assert torch.equal(labels, torch.as_tensor(ref.target, dtype=torch.int64)[order])
