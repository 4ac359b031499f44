"""Fetch Google's Magika model (Apache-2.0) reproducibly from its PyPI wheel.

Downloads magika==1.0.3 without dependencies, checks the wheel's sha256, extracts the model
and its two configuration files into examples/magika/model/, checks their sha256, and writes
labels.tsv, the compact label table the magika component embeds. Idempotent: does nothing
when the files are present and intact. Needs only python3 with pip.

Usage: python3 scripts/fetch_magika.py
"""

import json
import pathlib

import pinned_wheel

VERSION = "1.0.3"
WHEEL = f"magika-{VERSION}-py3-none-manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529"
FILES = {
    "magika/models/standard_v3_3/model.onnx":
        "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
    "magika/models/standard_v3_3/config.min.json":
        "ae24c742205358f6ff6dfd5facb6743fb69743dbba8373e73da58ff0cbd695db",
    "magika/config/content_types_kb.min.json":
        "75208adba69bc0556403b62b32ef3ccf8b5ce494411780845852e52e6583a10d",
}
OUT = pathlib.Path(__file__).resolve().parent.parent / "examples" / "magika" / "model"


def intact():
    return pinned_wheel.intact(OUT, FILES) and (OUT / "labels.tsv").is_file()


def write_label_table():
    config = json.loads((OUT / "config.min.json").read_text())
    knowledge = json.loads((OUT / "content_types_kb.min.json").read_text())
    lines = [
        "# features: " + " ".join(
            f"{key}={config[key]}" for key in
            ("beg_size", "end_size", "padding_token", "block_size", "min_file_size_for_dl")),
        "# label\tthreshold\tis_text\toutput_label",
    ]
    for label in config["target_labels_space"]:
        threshold = config["thresholds"].get(label, config["medium_confidence_threshold"])
        output = config["overwrite_map"].get(label, label)
        is_text = int(knowledge.get(output, {}).get("is_text", False))
        lines.append(f"{label}\t{threshold}\t{is_text}\t{output}")
    (OUT / "labels.tsv").write_text("\n".join(lines) + "\n")


def main():
    if intact():
        return
    pinned_wheel.extract(f"magika=={VERSION}", "manylinux_2_28_x86_64", WHEEL, WHEEL_SHA256, FILES, OUT)
    write_label_table()
    print(f"magika {VERSION} model ready in {OUT}")


if __name__ == "__main__":
    main()
