"""A torch module instrumented with forward hooks: one ``inference`` point per call, GPU
time from CUDA events on a GPU (never synchronising), per-module times on 1 call in 10.

    python3 torch_module.py [udp://127.0.0.1:8089]
"""

import sys

import torch

import edgewatch

url = sys.argv[1] if len(sys.argv) > 1 else "udp://127.0.0.1:8089"
device = "cuda" if torch.cuda.is_available() else "cpu"
net = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10),
).to(device).eval()

rec = edgewatch.Recorder(url, app="torch-example")
hooks = edgewatch.torch.instrument(net, rec, model="tiny-cnn", per_module=True, sample_every=10)
with torch.no_grad():
    for _ in range(100):
        frames = torch.rand(4, 3, 224, 224, device=device)  # batch_size=4, input_length=224
        net(frames)
hooks.remove()
rec.close()
print(rec.stats())
