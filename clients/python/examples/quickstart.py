"""The first lines of instrumentation: wall, stage and (with torch on CUDA) GPU time per
inference, sent to the agent on this machine without slowing the loop down.

    python3 quickstart.py [udp://127.0.0.1:8089 | http://127.0.0.1:9400]
"""

import random
import sys
import time

import edgewatch


def prep(frame):
    time.sleep(0.002)
    return frame


def model(x):
    time.sleep(0.010 + random.random() * 0.005)
    return x


def post(y):
    time.sleep(0.001)
    return y


url = sys.argv[1] if len(sys.argv) > 1 else "udp://127.0.0.1:8089"
rec = edgewatch.Recorder(url, app="camera", tags={"site": "a"})
for frame in range(100):
    with rec.infer("yolov8n", batch_size=1, input_length=640, model_version="3") as t:
        with t.stage("preprocess"):
            x = prep(frame)
        with t.gpu():  # gpu_ms from CUDA events when torch + CUDA are present
            y = model(x)
        with t.stage("postprocess"):
            out = post(y)
rec.record("yolov8n", wall_ms=18.2, gpu_ms=11.7, batch_size=4)  # measured elsewhere
rec.close()  # also runs at interpreter exit
print(rec.stats())
