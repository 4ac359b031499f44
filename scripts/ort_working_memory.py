#!/usr/bin/env python3
"""What ONNX Runtime's CPU kernels hold outside the arena that `--run-memory` caps.

Sluice caps what model runs hold with ONNX Runtime's arena, registered for the environment
(`max_mem`, extended as requested). A kernel that works in the heap instead is not capped: a
tenant's graph that feeds it tensors the arena allows can grow the server past the cap. Each
case below is one graph, its tensors made inside the graph (RandomUniform, ConstantOfShape)
from nothing, as a tenant's graph can, ending in `Shape` so that no big output leaves it; each
runs once in a process of its own under an arena of CAP MiB, optimisations off (nothing folded
at load), two intra-op threads. It prints the process's peak resident growth during the run
and how the run ended. An operator whose growth passes the cap by far works outside it; one
the arena refused before it grew past the cap did not, as far as this input shows.

Needs onnxruntime 1.32.0, onnx and numpy in the Python that runs it, e.g.
  python3 -m venv /tmp/ortv && /tmp/ortv/bin/pip install onnxruntime==1.32.0 onnx numpy
Usage: /tmp/ortv/bin/python scripts/ort_working_memory.py [CAP_MIB] [CASE ...]
"""

import json
import resource
import subprocess
import sys
import time

import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h

MIB = 1 << 20
N = 4 * MIB  # elements of the cases' main tensor: 16 MiB of floats


def const(name, dtype, dims, values):
    return h.make_node("Constant", [], [name], value=h.make_tensor(name + "_value", dtype, dims, values))


def fill(name, shape, dtype=T.FLOAT, value=1):
    return [
        const(name + "_shape", T.INT64, [len(shape)], shape),
        h.make_node("ConstantOfShape", [name + "_shape"], [name], value=h.make_tensor(name + "_v", dtype, [1], [value])),
    ]


def rand(name, shape, dtype=T.FLOAT):
    if dtype == T.FLOAT:
        return [h.make_node("RandomUniform", [], [name], shape=shape, dtype=T.FLOAT, seed=1.0)]
    return [h.make_node("RandomUniform", [], [name + "_f"], shape=shape, dtype=T.FLOAT, seed=1.0),
            h.make_node("Cast", [name + "_f"], [name], to=dtype)]


def op(op_type, inputs, outputs=("y",), **attributes):
    return [h.make_node(op_type, list(inputs), list(outputs), **attributes)]


def resize(shape, scales, **attributes):
    return rand("x", shape) + [const("s", T.FLOAT, [len(scales)], scales)] + op("Resize", ["x", "", "s"], **attributes)


ML = (("ai.onnx.ml", 3),)
MS = (("com.microsoft", 1),)
# name: (nodes whose output `y` is measured, opset, other domains)
CASES = {
    "Add (the floor)": (rand("x", [N]) + op("Add", ["x", "x"]), 21, ()),
    "Unique": (rand("x", [N]) + op("Unique", ["x"]), 21, ()),
    "NonZero, rank 8": (fill("x", [N // 8] + [1] * 7, T.BOOL) + op("NonZero", ["x"]), 21, ()),
    "DFT, length 2^22": (rand("x", [1, N, 1]) + op("DFT", ["x"]), 19, ()),
    "DFT, a prime length": (rand("x", [1, 500_009, 1]) + op("DFT", ["x"]), 19, ()),
    "TopK, k all": (rand("x", [N // 2]) + [const("k", T.INT64, [1], [N // 2])] + op("TopK", ["x", "k"], ["v", "y"]), 21, ()),
    "ArgMax, axis 0": (rand("x", [N // 2, 2]) + op("ArgMax", ["x"], axis=0), 21, ()),
    "ReduceMax, uint8, axis 0": (
        rand("x", [N, 2], T.UINT8) + [const("a", T.INT64, [1], [0])] + op("ReduceMax", ["x", "a"]), 21, ()),
    "ReduceSum, rank 22, every other axis": (
        rand("x", [2] * 22) + [const("a", T.INT64, [11], list(range(0, 22, 2)))] + op("ReduceSum", ["x", "a"]), 21, ()),
    "Transpose, rank 22, reversed": (rand("x", [2] * 22) + op("Transpose", ["x"], perm=list(range(21, -1, -1))), 21, ()),
    "GatherND, one index a slice": (rand("x", [N]) + fill("i", [N // 2, 1], T.INT64, 0) + op("GatherND", ["x", "i"]), 21, ()),
    "ScatterND, one index a slice": (
        rand("x", [N // 2]) + fill("i", [N // 4, 1], T.INT64, 0) + rand("u", [N // 4]) + op("ScatterND", ["x", "i", "u"]), 21, ()),
    "ScatterElements, rank 20": (
        rand("x", [2] * 20) + fill("i", [2] * 20, T.INT64, 0) + rand("u", [2] * 20) + op("ScatterElements", ["x", "i", "u"]), 21, ()),
    "NonMaxSuppression, one box, N classes": (
        rand("b", [1, 1, 4]) + rand("s", [1, N, 1]) + [const("m", T.INT64, [1], [1])]
        + op("NonMaxSuppression", ["b", "s", "m"]), 21, ()),
    "Resize linear, 512² up 4×": (resize([1, 1, 512, 512], [1, 1, 4, 4], mode="linear"), 21, ()),
    "Resize linear, a row to 4 rows": (resize([1, 1, 1, N // 4], [1, 1, 4, 1], mode="linear"), 21, ()),
    "Resize nearest, a row to 4 rows": (resize([1, 1, 1, N // 2], [1, 1, 4, 1]), 21, ()),
    "Resize cubic, 512² up 4×": (resize([1, 1, 512, 512], [1, 1, 4, 4], mode="cubic"), 21, ()),
    "Resize cubic, a row to 4 rows": (resize([1, 1, 1, N // 2], [1, 1, 4, 1], mode="cubic"), 21, ()),
    "Resize cubic antialiased, a row to 4 rows": (
        resize([1, 1, 1, N // 4], [1, 1, 4, 1], mode="cubic", antialias=1), 21, ()),
    "Resize cubic, 2048² down 4×": (resize([1, 1, 2048, 2048], [1, 1, 0.25, 0.25], mode="cubic"), 21, ()),
    "Upsample cubic (opset 9), a row to 4 rows": (
        rand("x", [1, 1, 1, N // 2]) + [const("s", T.FLOAT, [4], [1, 1, 4, 1])] + op("Upsample", ["x", "s"], mode="cubic"), 9, ()),
    "GridSample cubic": (rand("x", [1, 1, 512, 512]) + rand("g", [1, 1024, 1024, 2]) + op("GridSample", ["x", "g"], mode="cubic"), 21, ()),
    "STFT, frames of 16, step 1": (
        rand("x", [1, N // 8, 1]) + [const("st", T.INT64, [], [1]), const("fl", T.INT64, [], [16])]
        + op("STFT", ["x", "st", "", "fl"]), 21, ()),
    "Einsum, rank 8 transposed": (rand("x", [8] * 7 + [2]) + op("Einsum", ["x"], equation="abcdefgh->hgfedcba"), 21, ()),
    "Einsum, batched matmul": (
        rand("a", [256, 64, 64]) + rand("b", [256, 64, 64]) + op("Einsum", ["a", "b"], equation="bij,bjk->bik"), 21, ()),
    "CumSum": (rand("x", [N]) + [const("a", T.INT64, [], [0])] + op("CumSum", ["x", "a"], reverse=1), 21, ()),
    "Compress, all kept": (rand("x", [N]) + fill("c", [N], T.BOOL, 1) + op("Compress", ["x", "c"], axis=0), 21, ()),
    "Pad reflect, rank 8": (rand("x", [4] * 8) + [const("p", T.INT64, [16], [1] * 16)] + op("Pad", ["x", "p"], mode="reflect"), 21, ()),
    "Conv, 64×64 kernel": (rand("x", [1, 1, 512, 512]) + rand("w", [1, 1, 64, 64]) + op("Conv", ["x", "w"]), 21, ()),
    "MaxPool with indices": (rand("x", [1, 1, 2048, 2048]) + op("MaxPool", ["x"], ["v", "y"], kernel_shape=[2, 2]), 21, ()),
    "Col2Im": (rand("x", [1, 64, 65536]) + [const("i", T.INT64, [2], [263, 263]), const("b", T.INT64, [2], [8, 8])]
               + op("Col2Im", ["x", "i", "b"]), 21, ()),
    "LSTM, a long sequence": (rand("x", [N // 64, 1, 16]) + rand("w", [1, 64, 16]) + rand("r", [1, 64, 16])
                              + op("LSTM", ["x", "w", "r"], hidden_size=16), 21, ()),
    "ConvTranspose, 16×16 kernel": (rand("x", [1, 1, 128, 128]) + rand("w", [1, 1, 16, 16]) + op("ConvTranspose", ["x", "w"]), 21, ()),
    "GRU, a long sequence": (rand("x", [N // 64, 1, 16]) + rand("w", [1, 48, 16]) + rand("r", [1, 48, 16])
                             + op("GRU", ["x", "w", "r"], hidden_size=16), 21, ()),
    "Einsum, a diagonal": (rand("x", [2048, 2048]) + op("Einsum", ["x"], equation="ii->i"), 21, ()),
    "Einsum, outer product": (rand("a", [2048]) + rand("b", [2048]) + op("Einsum", ["a", "b"], equation="i,j->ij"), 21, ()),
    "OneHot, depth 1024": (fill("i", [N // 1024], T.INT64, 3) + [const("d", T.INT64, [], [1024]), const("v", T.FLOAT, [2], [0, 1])]
                           + op("OneHot", ["i", "d", "v"]), 21, ()),
    "Gather, negative indices": (rand("x", [N]) + fill("i", [N // 2], T.INT64, -1) + op("Gather", ["x", "i"]), 21, ()),
    "Split into 1,024": (rand("x", [1024, N // 1024]) + op("Split", ["x"], ["y"] + [f"s{i}" for i in range(1023)], num_outputs=1024), 21, ()),
    "LRN, size 63": (rand("x", [1, 64, 256, 256]) + op("LRN", ["x"], size=63), 21, ()),
    "InstanceNormalization": (rand("x", [1, 64, 256, 256]) + rand("s", [64]) + rand("b", [64])
                              + op("InstanceNormalization", ["x", "s", "b"]), 21, ()),
    "GroupNormalization": (rand("x", [1, 64, 256, 256]) + rand("s", [64]) + rand("b", [64])
                           + op("GroupNormalization", ["x", "s", "b"], num_groups=8), 21, ()),
    "MeanVarianceNormalization": (rand("x", [1, 64, 256, 256]) + op("MeanVarianceNormalization", ["x"]), 21, ()),
    "ReduceLogSumExp, axis 0": (rand("x", [N // 2, 2]) + [const("a", T.INT64, [1], [0])] + op("ReduceLogSumExp", ["x", "a"]), 21, ()),
    "DynamicQuantizeLinear": (rand("x", [N]) + op("DynamicQuantizeLinear", ["x"], ["y", "s", "z"]), 21, ()),
    "MatMulInteger": (rand("a", [1024, 1024], T.UINT8) + rand("b", [1024, 1024], T.UINT8) + op("MatMulInteger", ["a", "b"]), 21, ()),
    "SpaceToDepth": (rand("x", [1, 1, 2048, 2048]) + op("SpaceToDepth", ["x"], blocksize=8), 21, ()),
    "LpPool": (rand("x", [1, 1, 2048, 2048]) + op("LpPool", ["x"], kernel_shape=[8, 8]), 21, ()),
    "MaxPool, dilated": (rand("x", [1, 1, 2048, 2048]) + op("MaxPool", ["x"], kernel_shape=[4, 4], dilations=[64, 64]), 21, ()),
    "Mod, fmod": (rand("a", [N]) + rand("b", [N]) + op("Mod", ["a", "b"], fmod=1), 21, ()),
    "Bernoulli": (rand("x", [N]) + op("Bernoulli", ["x"], seed=1.0), 21, ()),
    "MelWeightMatrix": ([const("n", T.INT64, [], [1024]), const("d", T.INT64, [], [8192]), const("r", T.INT64, [], [16000]),
                         const("l", T.FLOAT, [], [0]), const("u", T.FLOAT, [], [8000])]
                        + op("MelWeightMatrix", ["n", "d", "r", "l", "u"]), 21, ()),
    "HannWindow": ([const("n", T.INT64, [], [N])] + op("HannWindow", ["n"]), 21, ()),
    "Scan, a running sum": (rand("x", [N // 16, 16]) + fill("s0", [16], T.FLOAT, 0) + op(
        "Scan", ["s0", "x"], ["s", "y"], num_scan_inputs=1,
        body=h.make_graph([h.make_node("Add", ["si", "xi"], ["so"]), h.make_node("Identity", ["so"], ["yo"])], "b",
                          [h.make_tensor_value_info("si", T.FLOAT, [16]), h.make_tensor_value_info("xi", T.FLOAT, [16])],
                          [h.make_tensor_value_info("so", T.FLOAT, [16]), h.make_tensor_value_info("yo", T.FLOAT, [16])])), 21, ()),
    "CenterCropPad": (rand("x", [2048, 2048]) + [const("s", T.INT64, [2], [4096, 1024])] + op("CenterCropPad", ["x", "s"]), 21, ()),
    "Col2Im, many blocks": (rand("x", [1, 4, N // 4]) + [const("i", T.INT64, [2], [1025, 1025]), const("b", T.INT64, [2], [2, 2])]
                            + op("Col2Im", ["x", "i", "b"]), 21, ()),
    "Multinomial, N samples": (rand("x", [1, 2]) + op("Multinomial", ["x"], sample_size=N), 21, ()),
    "Softmax, axis 0": (rand("x", [N // 2, 2]) + op("Softmax", ["x"], axis=0), 21, ()),
    "Hardmax, axis 0": (rand("x", [N // 2, 2]) + op("Hardmax", ["x"], axis=0), 21, ()),
    "LayerNormalization": (rand("x", [4, N // 4]) + rand("s", [N // 4]) + op("LayerNormalization", ["x", "s"]), 21, ()),
    "TfIdfVectorizer": (fill("x", [N // 2, 2], T.INT64, 1) + op(
        "TfIdfVectorizer", ["x"], mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=0,
        ngram_counts=[0, 2], ngram_indexes=[0, 1, 2], pool_int64s=[1, 2, 1, 1]), 21, ()),
    "Where, broadcast, rank 21": (rand("x", [2] * 21) + fill("c", [1] * 21, T.BOOL, 1) + op("Where", ["c", "x", "x"]), 21, ()),
    "Expand to rank 22": (rand("x", [1]) + [const("s", T.INT64, [22], [2] * 22)] + op("Expand", ["x", "s"]), 21, ()),
    "MaxRoiPool, many regions": (rand("x", [1, 1, 64, 64]) + fill("r", [N // 16, 5], T.FLOAT, 0)
                                 + op("MaxRoiPool", ["x", "r"], pooled_shape=[4, 4]), 21, ()),
    "AffineGrid, 2048²": (rand("t", [1, 2, 3]) + [const("s", T.INT64, [4], [1, 1, 2048, 2048])] + op("AffineGrid", ["t", "s"]), 21, ()),
    "AffineGrid, 4096²": (rand("t", [1, 2, 3]) + [const("s", T.INT64, [4], [1, 1, 4096, 4096])] + op("AffineGrid", ["t", "s"]), 21, ()),
    "AffineGrid, 3-D 256³": (rand("t", [1, 3, 4]) + [const("s", T.INT64, [5], [1, 1, 256, 256, 256])] + op("AffineGrid", ["t", "s"]), 21, ()),
    "MaxUnpool": (rand("x", [1, 1, 1024, 1024]) + fill("i", [1, 1, 1024, 1024], T.INT64, 0)
                  + op("MaxUnpool", ["x", "i"], kernel_shape=[2, 2], strides=[2, 2]), 21, ()),
    "RNN, a long sequence": (rand("x", [N // 64, 1, 16]) + rand("w", [1, 16, 16]) + rand("r", [1, 16, 16])
                             + op("RNN", ["x", "w", "r"], hidden_size=16), 21, ()),
    "TensorScatter, a long cache": (fill("c", [1, N // 16, 16]) + fill("u", [1, N // 32, 16]) + op("TensorScatter", ["c", "u"], axis=1), 24, ()),
    "CumProd": (fill("x", [N]) + [const("a", T.INT64, [], [0])] + op("CumProd", ["x", "a"], reverse=1), 26, ()),
    "RMSNormalization": (fill("x", [4, N // 4]) + fill("s", [N // 4]) + op("RMSNormalization", ["x", "s"]), 24, ()),
    "Tile, 4096 times": (rand("x", [1024]) + [const("r", T.INT64, [1], [4096])] + op("Tile", ["x", "r"]), 21, ()),
    "GatherElements, axis 0": (rand("x", [N // 2, 2]) + fill("i", [N // 2, 2], T.INT64, 0) + op("GatherElements", ["x", "i"]), 21, ()),
    "ConvInteger, 64×64 kernel": (rand("x", [1, 1, 512, 512], T.UINT8) + rand("w", [1, 1, 64, 64], T.UINT8) + op("ConvInteger", ["x", "w"]), 21, ()),
    "QLinearMatMul": (rand("a", [1024, 1024], T.UINT8) + [const("as", T.FLOAT, [], [0.1]), const("az", T.UINT8, [], [0])]
                      + rand("b", [1024, 1024], T.UINT8) + [const("bs", T.FLOAT, [], [0.1]), const("bz", T.UINT8, [], [0]),
                                                           const("ys", T.FLOAT, [], [0.1]), const("yz", T.UINT8, [], [0])]
                      + op("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]), 21, ()),
    "GlobalLpPool": (rand("x", [1, 1024, 64, 64]) + op("GlobalLpPool", ["x"]), 21, ()),
    "LpNormalization, axis 0": (rand("x", [N // 2, 2]) + op("LpNormalization", ["x"], axis=0), 21, ()),
    "ReduceProd, axis 0": (rand("x", [N // 2, 2]) + [const("a", T.INT64, [1], [0])] + op("ReduceProd", ["x", "a"]), 21, ()),
    "AveragePool, 64×64 kernel": (rand("x", [1, 1, 1024, 1024]) + op("AveragePool", ["x"], kernel_shape=[64, 64]), 21, ()),
    "Gemm": (rand("a", [1024, 1024]) + rand("b", [1024, 1024]) + op("Gemm", ["a", "b"], transB=1), 21, ()),
    "Slice, step -1": (rand("x", [N]) + [const("s", T.INT64, [1], [-1]), const("e", T.INT64, [1], [-N - 1]), const("a", T.INT64, [1], [0]),
                                          const("p", T.INT64, [1], [-1])] + op("Slice", ["x", "s", "e", "a", "p"]), 21, ()),
    "Concat of 1,024": (rand("x", [N // 1024]) + op("Concat", ["x"] * 1024, axis=0), 21, ()),
    "BatchNormalization": (rand("x", [1, 64, 256, 256]) + rand("s", [64]) + rand("b", [64]) + rand("m", [64]) + rand("v", [64])
                           + op("BatchNormalization", ["x", "s", "b", "m", "v"]), 21, ()),
    "EyeLike": (rand("x", [2048, 2048]) + op("EyeLike", ["x"]), 21, ()),
    "BitCast": (fill("x", [N]) + op("BitCast", ["x"], to=T.INT32), 26, ()),
    "Attention (ONNX), 4,096 long": (fill("q", [1, 1, 4096, 8]) + op("Attention", ["q", "q", "q"]), 23, ()),
    "RotaryEmbedding (ONNX), 65,536 long": (fill("x", [1, 1, N // 64, 64]) + fill("c", [1, N // 64, 32]) + fill("s", [1, N // 64, 32])
                                            + op("RotaryEmbedding", ["x", "c", "s"]), 23, ()),
    "ai.onnx.ml TreeEnsembleRegressor": (rand("x", [N, 1]) + op(
        "TreeEnsembleRegressor", ["x"], domain="ai.onnx.ml", n_targets=1, nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2],
        nodes_featureids=[0, 0, 0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0, 0],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0], target_nodeids=[1, 2],
        target_ids=[0, 0], target_weights=[1.0, 2.0]), 21, ML),
    "ai.onnx.ml OneHotEncoder": (fill("x", [N // 2], T.INT64, 1) + op(
        "OneHotEncoder", ["x"], domain="ai.onnx.ml", cats_int64s=[0, 1, 2, 3]), 21, ML),
    "ai.onnx.ml LabelEncoder": (fill("x", [N // 2], T.INT64, 1) + op(
        "LabelEncoder", ["x"], domain="ai.onnx.ml", keys_int64s=[1, 2], values_int64s=[3, 4]), 21, (("ai.onnx.ml", 4),)),
    "com.microsoft Unique": (rand("x", [N]) + op("Unique", ["x"], ["y", "i", "c"], domain="com.microsoft"), 21, MS),
    "com.microsoft CDist": (rand("a", [2048, 4]) + rand("b", [2048, 4]) + op("CDist", ["a", "b"], domain="com.microsoft"), 21, MS),
    "com.microsoft CropAndResize": (
        rand("x", [1, 1, 64, 64]) + fill("r", [N // 64, 4], T.FLOAT, 0) + fill("b", [N // 64], T.INT32, 0)
        + [const("c", T.INT32, [2], [8, 8])] + op("CropAndResize", ["x", "r", "b", "c"], domain="com.microsoft"), 21, MS),
    "com.microsoft Inverse": (rand("x", [N // 4, 2, 2]) + op("Inverse", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft Gelu": (rand("x", [N]) + op("Gelu", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft FastGelu": (rand("x", [N]) + op("FastGelu", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft QuickGelu": (rand("x", [N]) + op("QuickGelu", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft ScaledSiLU": (rand("x", [N]) + op("ScaledSiLU", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft SampleOp": (rand("x", [N]) + op("SampleOp", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft Trilu": (rand("x", [2048, 2048]) + op("Trilu", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft ExpandDims": (rand("x", [N]) + [const("a", T.INT32, [], [0])] + op("ExpandDims", ["x", "a"], domain="com.microsoft"), 21, MS),
    "com.microsoft MurmurHash3": (rand("x", [N], T.INT32) + op("MurmurHash3", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft SkipSimplifiedLayerNormalization": (
        rand("x", [1, N // 4, 4]) + rand("s", [1, N // 4, 4]) + rand("g", [4])
        + op("SkipSimplifiedLayerNormalization", ["x", "s", "g"], domain="com.microsoft"), 21, MS),
    "com.microsoft TransposeMatMul": (rand("a", [1024, 1024]) + rand("b", [1024, 1024])
                                      + op("TransposeMatMul", ["a", "b"], domain="com.microsoft", transA=1), 21, MS),
    "com.microsoft MatMulIntegerToFloat": (
        rand("a", [1024, 1024], T.UINT8) + rand("b", [1024, 1024], T.UINT8) + rand("sa", [1]) + rand("sb", [1])
        + op("MatMulIntegerToFloat", ["a", "b", "sa", "sb"], domain="com.microsoft"), 21, MS),
    "com.microsoft MatMulInteger16": (rand("a", [1024, 1024], T.INT16) + rand("b", [1024, 1024], T.INT16)
                                      + op("MatMulInteger16", ["a", "b"], domain="com.microsoft"), 21, MS),
    "com.microsoft MatMulNBits, 4 bits": (
        rand("a", [1024, 1024]) + rand("b", [1024, 32, 16], T.UINT8) + rand("s", [1024 * 32])
        + op("MatMulNBits", ["a", "b", "s"], domain="com.microsoft", K=1024, N=1024, bits=4, block_size=32), 21, MS),
    "com.microsoft QGemm": (
        rand("a", [1024, 1024], T.UINT8) + [const("as", T.FLOAT, [], [0.1]), const("az", T.UINT8, [], [0])] + rand("b", [1024, 1024], T.UINT8) + [const("bs", T.FLOAT, [], [0.1]), const("bz", T.UINT8, [], [0])]
        + op("QGemm", ["a", "as", "az", "b", "bs", "bz"], domain="com.microsoft"), 21, MS),
    "com.microsoft QLinearAdd, broadcast": (
        rand("a", [N // 2, 2], T.UINT8) + [const("as", T.FLOAT, [], [0.1]), const("az", T.UINT8, [], [0])] + rand("b", [2], T.UINT8) + [const("bs", T.FLOAT, [], [0.1]), const("bz", T.UINT8, [], [0]), const("cs", T.FLOAT, [], [0.1]), const("cz", T.UINT8, [], [0])]
        + op("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], domain="com.microsoft"), 21, MS),
    "com.microsoft QLinearMul": (
        rand("a", [N], T.UINT8) + [const("as", T.FLOAT, [], [0.1]), const("az", T.UINT8, [], [0])] + rand("b", [N], T.UINT8) + [const("bs", T.FLOAT, [], [0.1]), const("bz", T.UINT8, [], [0]), const("cs", T.FLOAT, [], [0.1]), const("cz", T.UINT8, [], [0])]
        + op("QLinearMul", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], domain="com.microsoft"), 21, MS),
    "com.microsoft QLinearSigmoid": (rand("x", [N], T.UINT8) + [const("xs", T.FLOAT, [], [0.1]), const("xz", T.UINT8, [], [0]), const("ys", T.FLOAT, [], [0.1]), const("yz", T.UINT8, [], [0])]
                                     + op("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"], domain="com.microsoft"), 21, MS),
    "com.microsoft QLinearLeakyRelu": (rand("x", [N], T.UINT8) + [const("xs", T.FLOAT, [], [0.1]), const("xz", T.UINT8, [], [0]), const("ys", T.FLOAT, [], [0.1]), const("yz", T.UINT8, [], [0])]
                                       + op("QLinearLeakyRelu", ["x", "xs", "xz", "ys", "yz"], domain="com.microsoft"), 21, MS),
    "com.microsoft QLinearAveragePool": (
        rand("x", [1, 1, 2048, 2048], T.UINT8) + [const("xs", T.FLOAT, [], [0.1]), const("xz", T.UINT8, [], [0]), const("ys", T.FLOAT, [], [0.1]), const("yz", T.UINT8, [], [0])]
        + op("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], domain="com.microsoft", kernel_shape=[8, 8]), 21, MS),
    "com.microsoft QLinearGlobalAveragePool": (
        rand("x", [1, 1024, 64, 64], T.UINT8) + [const("xs", T.FLOAT, [], [0.1]), const("xz", T.UINT8, [], [0]), const("ys", T.FLOAT, [], [0.1]), const("yz", T.UINT8, [], [0])]
        + op("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], domain="com.microsoft"), 21, MS),
    "com.microsoft QLinearWhere": (
        fill("c", [N], T.BOOL, 1) + rand("x", [N], T.UINT8) + rand("w", [N], T.UINT8)
        + [const("xs", T.FLOAT, [], [0.1]), const("xz", T.UINT8, [], [0]), const("ws", T.FLOAT, [], [0.1]), const("wz", T.UINT8, [], [0]),
           const("zs", T.FLOAT, [], [0.1]), const("zz", T.UINT8, [], [0])]
        + op("QLinearWhere", ["c", "x", "xs", "xz", "w", "ws", "wz", "zs", "zz"], domain="com.microsoft"), 21, MS),
    "com.microsoft QLinearConcat": (
        rand("a", [N // 2], T.UINT8) + [const("ys", T.FLOAT, [], [0.1]), const("yz", T.UINT8, [], [0]), const("as", T.FLOAT, [], [0.1]), const("az", T.UINT8, [], [0])]
        + op("QLinearConcat", ["ys", "yz", "a", "as", "az", "a", "as", "az"], domain="com.microsoft", axis=0), 21, MS),
    "com.microsoft QuantizeLinear": (rand("x", [N]) + [const("s", T.FLOAT, [], [0.1]), const("z", T.UINT8, [], [0])]
                                     + op("QuantizeLinear", ["x", "s", "z"], domain="com.microsoft"), 21, MS),
    "com.microsoft DequantizeLinear": (rand("x", [N], T.UINT8) + [const("s", T.FLOAT, [], [0.1]), const("z", T.UINT8, [], [0])]
                                       + op("DequantizeLinear", ["x", "s", "z"], domain="com.microsoft"), 21, MS),
    "com.microsoft QAttention, 2,048 long": (
        rand("x", [1, 2048, 8], T.UINT8) + rand("w", [8, 24], T.UINT8) + rand("b", [24])
        + [const("xs", T.FLOAT, [], [0.1]), const("ws", T.FLOAT, [], [0.1])]
        + op("QAttention", ["x", "w", "b", "xs", "ws"], domain="com.microsoft", num_heads=1), 21, MS),
    "com.microsoft EmbedLayerNormalization": (
        fill("i", [1, 4096], T.INT32, 1) + rand("we", [64, 1024]) + rand("pe", [4096, 1024]) + rand("g", [1024]) + rand("b", [1024])
        + op("EmbedLayerNormalization", ["i", "", "we", "pe", "", "g", "b"], ["y", "m"], domain="com.microsoft"), 21, MS),
    "com.microsoft GatherBlockQuantized": (
        rand("d", [4096, 512], T.UINT8) + fill("i", [N // 1024], T.INT64, 1) + rand("s", [4096, 16])
        + op("GatherBlockQuantized", ["d", "i", "s"], domain="com.microsoft", block_size=32, quantize_axis=1, bits=8), 21, MS),
    "com.microsoft GatherND": (rand("x", [N]) + fill("i", [N // 2, 1], T.INT64, 0) + op("GatherND", ["x", "i"], domain="com.microsoft"), 21, MS),
    "com.microsoft Pad, reflect": (rand("x", [2048, 2048]) + [const("p", T.INT64, [4], [1, 1, 1, 1])]
                                   + op("Pad", ["x", "p"], domain="com.microsoft", mode="reflect"), 21, MS),
    "com.microsoft ConvTransposeWithDynamicPads, 16×16 kernel": (
        rand("x", [1, 1, 128, 128]) + rand("w", [1, 1, 16, 16]) + [const("p", T.INT64, [4], [0, 0, 0, 0])]
        + op("ConvTransposeWithDynamicPads", ["x", "w", "p"], domain="com.microsoft"), 21, MS),
    "com.microsoft RotaryEmbedding, 65,536 long": (
        rand("x", [1, N // 64, 64]) + [const("p", T.INT64, [], [0])] + rand("c", [N // 64, 32]) + rand("s", [N // 64, 32])
        + op("RotaryEmbedding", ["x", "p", "c", "s"], domain="com.microsoft", num_heads=1), 21, MS),
    "com.microsoft DecoderMaskedMultiHeadAttention": (
        rand("q", [4, 1, 64]) + rand("pk", [4, 1, 4096, 64]) + rand("pv", [4, 1, 4096, 64]) + [const("pl", T.INT32, [1], [4095])]
        + op("DecoderMaskedMultiHeadAttention", ["q", "q", "q", "", "", "pk", "pv", "pl"], ["y", "k", "v"], domain="com.microsoft",
             num_heads=1, past_present_share_buffer=1), 21, MS),
    "com.microsoft DynamicTimeWarping, a column": (rand("x", [N, 1]) + op("DynamicTimeWarping", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft DynamicTimeWarping, a row": (rand("x", [1, N]) + op("DynamicTimeWarping", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft DynamicTimeWarping, square": (rand("x", [2048, 2048]) + op("DynamicTimeWarping", ["x"], domain="com.microsoft"), 21, MS),
    "com.microsoft MultiHeadAttention, 8,192 long": (
        rand("q", [1, 8192, 8]) + op("MultiHeadAttention", ["q", "q", "q"], domain="com.microsoft", num_heads=1), 21, MS),
    "com.microsoft Attention, 4,096 long": (rand("x", [1, 4096, 8]) + rand("w", [8, 24]) + rand("b", [24])
                                            + op("Attention", ["x", "w", "b"], domain="com.microsoft", num_heads=1), 21, MS),
    "com.microsoft GroupQueryAttention, 16,384 long": (
        rand("q", [1, N // 256, 64]) + rand("k", [1, N // 256, 64]) + rand("v", [1, N // 256, 64])
        + [const("sl", T.INT32, [1], [N // 256 - 1]), const("tl", T.INT32, [], [N // 256])]
        + op("GroupQueryAttention", ["q", "k", "v", "", "", "sl", "tl"], ["y", "pk", "pv"], domain="com.microsoft",
             num_heads=1, kv_num_heads=1), 21, MS),
    "com.microsoft UnfoldTensor": (rand("x", [N]) + op("UnfoldTensor", ["x"], domain="com.microsoft", dim=0, size=4, step=1), 21, MS),
    "com.microsoft NGramHashMapping": (
        fill("i", [1, N // 4], T.INT64, 7) + [const("m", T.INT64, [2], [3, 5]), const("v", T.INT64, [1], [1000])]
        + op("NGramHashMapping", ["i", "m", "v"], domain="com.microsoft", max_ngram_size=2, n_head_per_ngram=1, pad_id=0), 21, MS),
    "com.microsoft GridSample": (rand("x", [1, 1, 512, 512]) + rand("g", [1, 1024, 1024, 2])
                                 + op("GridSample", ["x", "g"], domain="com.microsoft", mode="bilinear"), 21, MS),
    "com.microsoft MaxpoolWithMask": (rand("x", [1, 1, 2048, 2048]) + rand("m", [1, 1, 2048, 2048], T.INT32)
                                      + op("MaxpoolWithMask", ["x", "m"], domain="com.microsoft", kernel_shape=[2, 2]), 21, MS),
    "com.microsoft NhwcMaxPool": (rand("x", [1, 2048, 2048, 1], T.UINT8)
                                  + op("NhwcMaxPool", ["x"], domain="com.microsoft", kernel_shape=[2, 2]), 21, MS),
    "com.microsoft Range": ([const("a", T.INT64, [], [0]), const("b", T.INT64, [], [N])]
                            + op("Range", ["a", "b"], domain="com.microsoft"), 21, MS),
    "com.microsoft FusedMatMul": (rand("a", [1024, 1024]) + rand("b", [1024, 1024])
                                  + op("FusedMatMul", ["a", "b"], domain="com.microsoft", transB=1), 21, MS),
    "com.microsoft FusedGemm": (rand("a", [1024, 1024]) + rand("b", [1024, 1024])
                                + op("FusedGemm", ["a", "b"], domain="com.microsoft", activation="Relu"), 21, MS),
    "com.microsoft FusedConv, 64×64 kernel": (rand("x", [1, 1, 512, 512]) + rand("w", [1, 1, 64, 64])
                                             + op("FusedConv", ["x", "w"], domain="com.microsoft", activation="Relu"), 21, MS),
    "com.microsoft BiasGelu": (rand("x", [N // 4, 4]) + rand("b", [4]) + op("BiasGelu", ["x", "b"], domain="com.microsoft"), 21, MS),
    "com.microsoft SkipLayerNormalization": (
        rand("x", [1, N // 4, 4]) + rand("s", [1, N // 4, 4]) + rand("g", [4]) + rand("b", [4])
        + op("SkipLayerNormalization", ["x", "s", "g", "b"], domain="com.microsoft"), 21, MS),
    "com.microsoft DynamicQuantizeMatMul": (rand("a", [1024, 1024]) + rand("b", [1024, 1024], T.INT8) + rand("s", [1])
                                            + op("DynamicQuantizeMatMul", ["a", "b", "s"], domain="com.microsoft"), 21, MS),
    "com.microsoft QLinearConv, 64×64 kernel": (
        rand("x", [1, 1, 512, 512], T.UINT8) + [const("xs", T.FLOAT, [], [0.1]), const("xz", T.UINT8, [], [0])]
        + rand("w", [1, 1, 64, 64], T.UINT8) + [const("ws", T.FLOAT, [], [0.1]), const("wz", T.UINT8, [], [0]),
                                                const("ys", T.FLOAT, [], [0.1]), const("yz", T.UINT8, [], [0])]
        + op("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], domain="com.microsoft"), 21, MS),
    "com.microsoft QLinearSoftmax": (
        rand("x", [N // 2, 2], T.UINT8) + [const("xs", T.FLOAT, [], [0.1]), const("xz", T.UINT8, [], [0]),
                                           const("ys", T.FLOAT, [], [0.1]), const("yz", T.UINT8, [], [0])]
        + op("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], domain="com.microsoft", opset=13), 21, MS),
}


def run(name, cap_mib):
    """One run of the case, in this process; prints its growth as JSON."""
    nodes, opset, domains = CASES[name]
    graph = h.make_graph(nodes + op("Shape", ["y"], ["shape"]), "case", [],
                         [h.make_tensor_value_info("shape", T.INT64, None)])
    opsets = [h.make_opsetid("", opset)] + [h.make_opsetid(domain, version) for domain, version in domains]
    model = h.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    ort.set_default_logger_severity(4)
    memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(memory, ort.OrtArenaCfg({"max_mem": cap_mib * MIB, "arena_extend_strategy": 1}))
    options = ort.SessionOptions()
    options.add_session_config_entry("session.use_env_allocators", "1")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu = time.process_time()
    try:
        ended = "shape " + str(session.run(None, {})[0].tolist())
    except Exception as error:  # noqa: BLE001 - how the run ended is the result
        text = str(error)
        ended = "arena refused" if "Available memory of" in text else text.splitlines()[0][-80:]
    print(json.dumps({
        "growth_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024,
        "cpu_s": time.process_time() - cpu,
        "ended": ended,
    }))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        run(sys.argv[2], int(sys.argv[3]))
        return
    cap = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    names = sys.argv[2:] or list(CASES)
    print(f"| case | growth of one run under a {cap} MiB arena | × the cap | CPU | how it ended |")
    print("| --- | --- | --- | --- | --- |")
    for name in names:
        done = subprocess.run([sys.executable, __file__, "--one", name, str(cap)], capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            print(f"| {name} | | | | failed: {(done.stderr.strip().splitlines() or ['?'])[-1][-100:]} |", flush=True)
            continue
        result = json.loads(lines[-1])
        growth = result["growth_mib"]
        print(f"| {name} | {growth:.0f} MiB | {growth / cap:.1f} | {result['cpu_s']:.2f} s | {result['ended']} |",
              flush=True)


if __name__ == "__main__":
    main()
