"""A peer for the benchmarks: NVIDIA's PyTriton (Triton Inference Server with a Python model)
serving the digits MLP through ONNX Runtime, as its users would write it: dynamic batching
up to 32 rows, one ONNX Runtime thread. Run it with Debian's python3 (3.11.2): Triton's
Python backend stub does not work with the newer 3.11 patch releases' multiprocessing. It prints "peer listening" once it serves.

Usage: python scripts/peer_pytriton.py HTTP_PORT GRPC_PORT METRICS_PORT
(in a venv with nvidia-pytriton==0.7.0 and onnxruntime==1.32.0: scripts/bench_peer.sh)
"""

import pathlib
import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

MODEL = pathlib.Path(__file__).resolve().parent.parent / "examples" / "digits" / "model" / "digits.onnx"


def main():
    http_port, grpc_port, metrics_port = (int(port) for port in sys.argv[1:4])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(MODEL), options, providers=["CPUExecutionProvider"])

    @batch
    def infer(X):
        label, probabilities = session.run(None, {"X": X})
        return {"label": label.reshape(-1, 1), "probabilities": probabilities}

    config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    # Statistics open, as a plain Triton serves them (PyTriton guards them with a token).
    security = TritonSecurityConfig(restricted_endpoints=[])
    with Triton(config=config, security_config=security) as triton:
        triton.bind(
            model_name="digits-mlp",
            infer_func=infer,
            inputs=[Tensor(name="X", dtype=np.float32, shape=(64,))],
            outputs=[
                Tensor(name="label", dtype=np.int64, shape=(1,)),
                Tensor(name="probabilities", dtype=np.float32, shape=(10,)),
            ],
            config=ModelConfig(max_batch_size=32, batcher=DynamicBatcher()),
        )
        print("peer listening", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
