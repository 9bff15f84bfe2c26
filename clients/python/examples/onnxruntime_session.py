"""Every ``session.run`` of an ONNX Runtime session as one ``inference`` point.

    python3 onnxruntime_session.py MODEL.onnx [http://127.0.0.1:9400] [TOKEN]
"""

import sys

import numpy as np
import onnxruntime as ort

import edgewatch
from edgewatch.onnxruntime import InstrumentedSession

path = sys.argv[1]
url = sys.argv[2] if len(sys.argv) > 2 else "udp://127.0.0.1:8089"
token = sys.argv[3] if len(sys.argv) > 3 else None

rec = edgewatch.Recorder(url, app="onnx-example", token=token)
session = InstrumentedSession(ort.InferenceSession(path), rec, model="my-model")
inp = session.get_inputs()[0]
shape = [d if isinstance(d, int) else 1 for d in inp.shape]  # symbolic dims -> 1
x = np.random.rand(*shape).astype(np.float32)
for _ in range(100):
    session.run(None, {inp.name: x})  # batch_size and input_length from x.shape
rec.close()
print(rec.stats())
