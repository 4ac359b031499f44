"""Derive the half-precision twins of the digits MLP from model/digits.onnx.

Writes, next to this script:
  model/digits_fp16.onnx  FP16 throughout: input X FP16 [N, 64], weights FP16, every
                          operation in FP16, output probabilities FP16 [N, 10] (label INT64)
  model/digits_bf16.onnx  BF16 at its edges: input X and output probabilities BF16, weights
                          stored as BF16 and widened to FP32 when loaded, arithmetic in FP32
                          (ONNX Runtime's CPU provider has no BF16 MatMul, Relu or ArgMax)
and prints each file's sha256 for README.md. The output is the same bytes on every run.

Run: python3 half.py   (needs onnx, numpy, ml_dtypes: see README.md for the versions)
"""

import hashlib
import pathlib

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = pathlib.Path(__file__).resolve().parent
MODEL = HERE / "model"


def retype_edges(graph, elem):
    """Input X and output probabilities in `elem`; label stays INT64."""
    graph.input[0].type.tensor_type.elem_type = elem
    for output in graph.output:
        if output.name == "probabilities":
            output.type.tensor_type.elem_type = elem


def fp16(model):
    graph = model.graph
    retype_edges(graph, TensorProto.FLOAT16)
    # The graph opens with a Cast of X to FP32: it casts to FP16 instead, and every FP32
    # weight becomes FP16, so MatMul, Add, Relu, Softmax and ArgMax run in FP16.
    for node in graph.node:
        if node.op_type == "Cast" and node.input[0] == "X":
            for attribute in node.attribute:
                if attribute.name == "to":
                    attribute.i = TensorProto.FLOAT16
    weights = [
        numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name)
        if t.data_type == TensorProto.FLOAT
        else t
        for t in graph.initializer
    ]
    del graph.initializer[:]
    graph.initializer.extend(weights)
    return model


def bf16(model):
    graph = model.graph
    retype_edges(graph, TensorProto.BFLOAT16)
    widen, weights = [], []
    for t in graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            stored = f"{t.name}_bf16"
            weights.append(numpy_helper.from_array(numpy_helper.to_array(t).astype(ml_dtypes.bfloat16), stored))
            widen.append(helper.make_node("Cast", [stored], [t.name], to=TensorProto.FLOAT))
        else:
            weights.append(t)
    del graph.initializer[:]
    graph.initializer.extend(weights)
    # The opening Cast already widens X to FP32. The probabilities are narrowed at the end;
    # the label's ArgMax reads the FP32 ones.
    for node in graph.node:
        if node.op_type == "Identity" and node.output[0] == "probabilities":
            node.output[0] = "probabilities_fp32"
        if node.op_type == "ArgMax":
            node.input[0] = "probabilities_fp32"
    narrow = helper.make_node("Cast", ["probabilities_fp32"], ["probabilities"], to=TensorProto.BFLOAT16)
    nodes = widen + list(graph.node) + [narrow]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def main():
    for name, convert in (("digits_fp16", fp16), ("digits_bf16", bf16)):
        model = convert(onnx.load(str(MODEL / "digits.onnx")))
        model.graph.name = name
        onnx.checker.check_model(model, full_check=True)
        path = MODEL / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        print(f"{name}: sha256 {digest}, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
