"""The `digits` component in Python: the same contract as examples/digits (Rust).

Takes `image`: UINT8 (64 bytes per 8x8 grayscale image; shapes [64], [8, 8], [N, 64],
[N, 8, 8]) or BYTES (one 64-byte string per image); scales pixels to [0, 1], calls the
tenant's `digits-mlp` once per request and answers `label` INT64 [N], `top3_labels` INT64
[N, 3] and `top3_probabilities` FP32 [N, 3].

Build: componentize-py -d wit -w sluice:tenant/component componentize app \
           -p examples/digits-py -p guest-sdk/python -o digits_py.wasm
"""

import array

import sluice_guest as sg

PIXELS = 64
CLASSES = 10
TOP = 3


def read_images(tensor):
    if tensor.datatype == "BYTES":
        for index, image in enumerate(tensor.data):
            if len(image) != PIXELS:
                raise sg.InvalidInput(
                    f"image {index} has {len(image)} bytes; each image must be {PIXELS} bytes (8x8 grayscale)"
                )
        pixels = b"".join(tensor.data)
    elif tensor.datatype == "UINT8":
        pixels = tensor.data
    else:
        raise sg.InvalidInput(f"'image' must be UINT8 or BYTES, not {tensor.datatype}")
    if not pixels or len(pixels) % PIXELS:
        raise sg.InvalidInput(
            f"'image' has {len(pixels)} bytes; expected a multiple of {PIXELS} (8x8 grayscale per image)"
        )
    return pixels


def infer(request):
    pixels = read_images(request.input("image"))
    count = len(pixels) // PIXELS
    # Stored as FP32, a quotient computed in double precision is the single-precision
    # quotient the Rust component computes (double rounding is exact for division).
    scaled = array.array("f", (pixel / 255.0 for pixel in pixels))

    model = sg.Model.load("digits-mlp")
    outputs = model.compute({"X": sg.ModelTensor("FP32", [count, PIXELS], scaled.tobytes())})
    labels = outputs["label"].values()
    probabilities = outputs["probabilities"].values()
    if len(labels) != count or len(probabilities) != count * CLASSES:
        raise sg.ModelError("digits model returned an unexpected output size")

    top_labels, top_probabilities = [], []
    for row in range(count):
        scores = probabilities[row * CLASSES:(row + 1) * CLASSES]
        order = sorted(range(CLASSES), key=lambda c: scores[c], reverse=True)[:TOP]
        top_labels += order
        top_probabilities += [scores[c] for c in order]
    return [
        sg.Tensor.of("label", "INT64", [count], labels),
        sg.Tensor.of("top3_labels", "INT64", [count, TOP], top_labels),
        sg.Tensor.of("top3_probabilities", "FP32", [count, TOP], top_probabilities),
    ]


Handler = sg.handler(infer)
