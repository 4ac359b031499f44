"""Sluice's guest SDK for Python: tenant components written in Python, built with
componentize-py against the `sluice:tenant` world (`wit/sluice.wit`).

A component module defines its handler and exports it under the name componentize-py
looks for:

    import sluice_guest as sg

    def infer(request: sg.Request) -> list[sg.Tensor]:
        image = request.input("image").values()          # raises InvalidInput if missing
        model = sg.Model.load("digits-mlp")              # a model of the caller's tenant
        outputs = model.compute({"X": sg.ModelTensor.of("FP32", [1, 64], scaled)})
        return [sg.Tensor.of("label", "INT64", [1], outputs["label"].values())]

    Handler = sg.handler(infer)

Errors: raise `InvalidInput` (the client's fault: HTTP 400 / INVALID_ARGUMENT) or
`ModelError`; any other exception is the component's own failure (500 / INTERNAL). Model
calls go through the host's `wasi:nn`, batched with every tenant's calls of the same model.
"""

import array

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import graph, log as wit_log, tensor as nn, types

__all__ = ["InvalidInput", "ModelError", "Tensor", "Request", "ModelTensor", "Model", "handler", "log"]


class InvalidInput(Exception):
    """The request's inputs are not acceptable."""


class ModelError(Exception):
    """A model could not be loaded or failed to compute."""


# Element type name -> array typecode (little-endian: WebAssembly is).
_TYPECODES = {
    "UINT8": "B", "INT8": "b", "UINT16": "H", "INT16": "h", "UINT32": "I", "INT32": "i",
    "UINT64": "Q", "INT64": "q", "FP32": "f", "FP64": "d",
    # wasi:nn's names for the same types
    "U8": "B", "I32": "i", "I64": "q",
}


def _values(datatype, data):
    typecode = _TYPECODES.get(datatype)
    if typecode is None:
        raise InvalidInput(f"{datatype} elements have no Python value type here; read .data (raw bytes)")
    values = array.array(typecode)
    values.frombytes(data)
    return values


def _pack(datatype, values):
    typecode = _TYPECODES.get(datatype)
    if typecode is None:
        raise ValueError(f"cannot pack {datatype} values; pass raw little-endian bytes")
    return array.array(typecode, values).tobytes()


class Tensor:
    """A named, typed, shaped tensor of a request or response (OIP datatypes: "UINT8",
    "FP32", ..., "BYTES"). `data` is little-endian bytes, or a list of bytes for BYTES."""

    def __init__(self, name, datatype, shape, data):
        self.name, self.datatype, self.shape, self.data = name, datatype, list(shape), data

    @classmethod
    def of(cls, name, datatype, shape, values):
        """A tensor from Python values (numbers; bytes strings for BYTES)."""
        data = list(values) if datatype == "BYTES" else _pack(datatype, values)
        return cls(name, datatype, shape, data)

    def values(self):
        """The elements as Python values (an array of numbers; a list of bytes for BYTES)."""
        if self.datatype == "BYTES":
            return list(self.data)
        return _values(self.datatype, self.data)

    @classmethod
    def _from_wire(cls, tensor):
        return cls(tensor.name, tensor.datatype.name, tensor.shape, tensor.data.value)

    def _to_wire(self):
        contents = types.TensorData_Elements(self.data) if self.datatype == "BYTES" else types.TensorData_Raw(self.data)
        return types.Tensor(self.name, types.Datatype[self.datatype], self.shape, contents)


class Request:
    """An inference request: input tensors by name, string parameters, the client's id."""

    def __init__(self, wire):
        self.id = wire.id
        self.inputs = {tensor.name: Tensor._from_wire(tensor) for tensor in wire.inputs}
        self.parameters = dict(wire.parameters)

    def input(self, name):
        if name not in self.inputs:
            raise InvalidInput(f"missing input '{name}'")
        return self.inputs[name]


class ModelTensor:
    """A tensor handed to or returned by a model (wasi:nn types: "FP16", "FP32", "FP64",
    "BF16", "U8", "I32", "I64")."""

    def __init__(self, ty, dimensions, data):
        self.ty, self.dimensions, self.data = ty, list(dimensions), data

    @classmethod
    def of(cls, ty, dimensions, values):
        return cls(ty, dimensions, _pack(ty, values))

    def values(self):
        return _values(self.ty, self.data)


def _nn_message(error):
    value = error.value if isinstance(error, Err) else error
    return value.data() if hasattr(value, "data") else str(value)


class Model:
    """A model of the caller's tenant, by name."""

    def __init__(self, name, loaded):
        self.name, self._graph = name, loaded

    @staticmethod
    def load(name):
        try:
            return Model(name, graph.load_by_name(name))
        except Err as error:
            raise ModelError(f"cannot load model '{name}': {_nn_message(error)}") from None

    def compute(self, inputs):
        """Run the model on {name: ModelTensor}; answers {name: ModelTensor}."""
        try:
            context = self._graph.init_execution_context()
            named = [(name, nn.Tensor(t.dimensions, nn.TensorType[t.ty], t.data)) for name, t in inputs.items()]
            outputs = context.compute(named)
        except Err as error:
            raise ModelError(f"model '{self.name}' failed: {_nn_message(error)}") from None
        return {name: ModelTensor(t.ty().name, t.dimensions(), t.data()) for name, t in outputs}


def log(level, message):
    """A log line in the server's log, with the tenant and app ("info", "warn", ...)."""
    wit_log.log(wit_log.Level[level.upper()], message)


def handler(infer):
    """The component's export from `infer(request) -> list[Tensor]` (or a pair of that list
    and a dict of string parameters)."""

    class Handler(exports.Handler):
        def infer(self, request):
            try:
                answer = infer(Request(request))
            except InvalidInput as error:
                raise Err(types.InferError_InvalidInput(str(error))) from None
            except ModelError as error:
                raise Err(types.InferError_ModelError(str(error))) from None
            except Exception as error:  # the component's own failure
                raise Err(types.InferError_Internal(f"{type(error).__name__}: {error}")) from None
            outputs, parameters = answer if isinstance(answer, tuple) else (answer, {})
            return types.InferResponse([t._to_wire() for t in outputs], list(parameters.items()))

    return Handler
