"""Train the digits demo models on scikit-learn's bundled handwritten digits and export ONNX.

Writes, next to this script:
  model/digits.onnx        MLP (64 -> 64 -> 10), the model the `digits` component calls
  model/digits_small.onnx  MLP (64 -> 8 -> 10), the cascade's fast first stage
  testdata/heldout.json    the held-out images (8x8 grayscale bytes, 0-255) and labels
and prints each model's sha256 and held-out accuracy for README.md.

Inputs are pixels scaled to [0, 1] (byte / 255), as the component normalizes them.
Run: python3 train.py   (needs scikit-learn, skl2onnx, onnx, numpy)
"""

import hashlib
import json
import pathlib

import numpy as np
import onnx
from skl2onnx import to_onnx
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

HERE = pathlib.Path(__file__).resolve().parent
SEED = 0


def main():
    digits = load_digits()
    # The data set stores intensities 0..16; clients send 8-bit grayscale bytes.
    pixels = np.rint(digits.data * 255.0 / 16.0).astype(np.uint8)
    x_train, x_test, y_train, y_test = train_test_split(
        pixels, digits.target, test_size=0.2, random_state=SEED, stratify=digits.target
    )

    def scaled(batch):
        return (batch.astype(np.float32) / 255.0).astype(np.float32)

    for name, hidden in (("digits", (64,)), ("digits_small", (8,))):
        model = MLPClassifier(hidden_layer_sizes=hidden, max_iter=2000, random_state=SEED)
        model.fit(scaled(x_train), y_train)
        accuracy = model.score(scaled(x_test), y_test)
        onx = to_onnx(
            model,
            scaled(x_train[:1]),
            options={id(model): {"zipmap": False}},
            target_opset={"": 17, "ai.onnx.ml": 3},
        )
        path = HERE / "model" / f"{name}.onnx"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(onx.SerializeToString())
        onnx.checker.check_model(str(path))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        print(f"{name}: held-out accuracy {accuracy:.4f}, sha256 {digest}, "
              f"input {onx.graph.input[0].name}, {path.stat().st_size} bytes")

    heldout = {
        "source": "scikit-learn load_digits, train_test_split(test_size=0.2, random_state=0, stratified)",
        "images": x_test.tolist(),
        "labels": y_test.tolist(),
    }
    out = HERE / "testdata" / "heldout.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(heldout, separators=(",", ":")) + "\n")
    print(f"held-out set: {len(y_test)} images -> {out.relative_to(HERE)}")


if __name__ == "__main__":
    main()
