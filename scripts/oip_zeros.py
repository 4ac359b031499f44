"""An OIP inference request of one row of zeros for a model, from its metadata (what the
bench scripts send to measure the server, not the model)."""

import json


def zeros_request(metadata):
    """The request body (bytes): each input shaped as the metadata says, dynamic dimensions 1."""
    inputs = []
    for spec in metadata["inputs"]:
        shape = [1 if d < 0 else d for d in spec["shape"]]
        count = 1
        for d in shape:
            count *= d
        value = False if spec["datatype"] == "BOOL" else 0
        inputs.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"], "data": [value] * count})
    return json.dumps({"inputs": inputs}).encode()
