"""The PyTorch ResNet that tandem's ResNet is checked and timed against (imported by
tests/golden/make_resnet_fixture.py and bench/resnet_pytorch.py): torchvision's basic block and
names (conv1, bn1, layer<i>, fc), a 3x3 stem without pooling for small images, width doubling
and stride 2 at the first block of every stage after the first, 1x1 conv + BN projections where
the shape changes, global average pooling."""
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        o = F.relu(self.bn1(self.conv1(x)))
        o = self.bn2(self.conv2(o))
        return F.relu(o + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    """blocks[i] basic blocks in stage i, of width << i channels; resnet20 is ResNet(1, 16, [3, 3, 3], 10)."""

    def __init__(self, in_channels, width, blocks, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        cin = width
        for s, n in enumerate(blocks):
            stage = []
            for b in range(n):
                stage.append(Block(cin, width << s, 2 if s > 0 and b == 0 else 1))
                cin = width << s
            setattr(self, "layer%d" % (s + 1), nn.Sequential(*stage))
        self.stages = len(blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        for s in range(self.stages):
            h = getattr(self, "layer%d" % (s + 1))(h)
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))
