"""predict_in_pytorch.py: a LeNet-5 that ssdmpi exported, in plain PyTorch (no ssdmpi).

Run with  python predict_in_pytorch.py model.safetensors images.safetensors logits.safetensors
where images.safetensors holds one tensor, "images": raw samples (N, C, H, W) as the dataset has
them (Fashion-MNIST: uint8 0..255; digits: 0..16). It writes "logits" (N, classes) and "classes" (N,).
"""

import json
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn


class LeNet5(nn.Module):
    """ssdmpi's lenet5 (ssdmpi/nn/models.py): conv1 pads by 2, conv2 by 0 on inputs of 20x20 and
    more (28x28: 400 features), by 2 on smaller ones (8x8 digits: 64 features)."""

    def __init__(self, channels, height, width, classes):
        super().__init__()
        h, w = height // 2, width // 2
        pad2 = 0 if min(h, w) >= 10 else 2
        h, w = (h + 2 * pad2 - 4) // 2, (w + 2 * pad2 - 4) // 2
        self.conv1 = nn.Conv2d(channels, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5, padding=pad2)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16 * h * w, 120), nn.Linear(120, 84), nn.Linear(84, classes)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc3(torch.relu(self.fc2(x)))


model_file, images_file, out_file = sys.argv[1:4]
with safe_open(model_file, "pt") as f:
    meta = f.metadata()                          # strings: model, input_shape, num_classes, normalisation, ...
channels, height, width = json.loads(meta["input_shape"])
model = LeNet5(channels, height, width, int(meta["num_classes"]))
model.load_state_dict(load_file(model_file))     # PyTorch state_dict names: conv1.weight, ..., fc3.bias
model.eval()

norm = json.loads(meta["normalisation"])         # x = (raw * scale - mean[c]) / std[c], per channel c
raw = load_file(images_file)["images"].to(torch.float64)
mean = torch.tensor(norm["mean"], dtype=torch.float64).view(1, -1, 1, 1)
std = torch.tensor(norm["std"], dtype=torch.float64).view(1, -1, 1, 1)
x = ((raw * norm["scale"] - mean) / std).to(torch.float32)
with torch.no_grad():
    logits = model(x)
save_file({"logits": logits, "classes": logits.argmax(dim=1)}, out_file)
