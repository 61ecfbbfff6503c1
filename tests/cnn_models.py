"""The PyTorch twins of the CNN example's three models (examples' lenet, convbn and resnet), for the
fixtures (tests/fixtures/make_cnn_fixture.py), the interop test (tests/torch_cnn_interop.py) and the
speed/accuracy comparison (benchmarks/pytorch_cnn.py). Input [N, 1, 28, 28], 10 classes.

State_dict names follow nn.Sequential's indices ("0.weight", "3.conv1.weight", "5.downsample.1.running_var"),
which are the names xtrain's Sequential gives the same layers."""
from torch import nn


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock (expansion 1):
    relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), with shortcut = downsample (1x1 conv, stride,
    no bias; BatchNorm) when the stride is not 1 or the channel count changes, else the identity
    (and then no downsample entries in the state_dict)."""

    def __init__(self, in_channels, out_channels, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                                            nn.BatchNorm2d(out_channels))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = self.downsample(x) if self.downsample is not None else x
        return self.relu(out + shortcut)


def lenet(num_classes=10):
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_classes))


def convbn(num_classes=10):
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(3136, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, num_classes))


def resnet(num_classes=10):
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        BasicBlock(16, 16, 1), BasicBlock(16, 16, 1),
        BasicBlock(16, 32, 2), BasicBlock(32, 32, 1),
        BasicBlock(32, 64, 2), BasicBlock(64, 64, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))


MODELS = {"lenet": lenet, "convbn": convbn, "resnet": resnet}
