import torch

from fwk.models.cnn import SmallCNNConfig, small_cnn


def test_shape():
    model = small_cnn(SmallCNNConfig())
    assert model(torch.randn(5, 1, 8, 8)).shape == (5, 10)


def test_other_sizes_and_backward():
    model = small_cnn(SmallCNNConfig(in_channels=3, channels1=4, channels2=6, hidden=8, num_classes=7, dropout=0.1))
    out = model(torch.randn(2, 3, 13, 11))
    assert out.shape == (2, 7)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
