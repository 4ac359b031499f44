"""Drive a running Sluice with NVIDIA's unmodified tritonclient (HTTP and gRPC flavours).

The e2e test `clients::tritonclient_http_and_grpc` starts the server with the example tenant
and runs this script; any failed check raises and exits non-zero.

Usage: python tritonclient_check.py --http HOST:PORT --grpc HOST:PORT --key KEY --digits FILE
"""

import argparse
import json
import queue

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def expect_error(call, fragment):
    try:
        call()
    except InferenceServerException as error:
        check(fragment in str(error), f"error {error!r} lacks {fragment!r}")
        return str(error)
    raise AssertionError(f"expected an error containing {fragment!r}")


def run(client, module, headers, images, labels, flavour):
    check(client.is_server_live(), f"{flavour}: server not live")
    check(client.is_server_ready(), f"{flavour}: server not ready")
    server = client.get_server_metadata()
    name = server["name"] if isinstance(server, dict) else server.name
    check(name == "sluice", f"{flavour}: server name {name}")
    meta = client.get_model_metadata("digits-mlp", headers=headers)
    inputs = meta["inputs"] if isinstance(meta, dict) else [{"name": i.name, "datatype": i.datatype} for i in meta.inputs]
    check(inputs[0]["name"] == "X" and inputs[0]["datatype"] == "FP32", f"{flavour}: metadata {meta}")
    check(client.is_model_ready("digits", headers=headers), f"{flavour}: digits not ready")

    # The digits component, numpy UINT8 input, default encoding (binary for HTTP, raw for gRPC).
    image = module.InferInput("image", list(images.shape), "UINT8")
    image.set_data_from_numpy(images)
    result = client.infer("digits", [image], headers=headers)
    got = result.as_numpy("label")
    check(list(got) == list(labels), f"{flavour}: digits labels {got} != {labels}")

    # Requested outputs only.
    requested = [module.InferRequestedOutput("top3_probabilities")]
    result = client.infer("digits", [image], outputs=requested, headers=headers)
    top3 = result.as_numpy("top3_probabilities")
    check(top3.shape == (len(labels), 3) and result.as_numpy("label") is None, f"{flavour}: requested outputs")

    # The plain model with FP32 numpy input.
    x = module.InferInput("X", [len(labels), 64], "FP32")
    x.set_data_from_numpy((images.astype(np.float32) / 255.0).astype(np.float32))
    result = client.infer("digits-mlp", [x], headers=headers)
    check(list(result.as_numpy("label")) == list(labels), f"{flavour}: plain model labels")

    # BYTES input to magika.
    document = json.dumps({"name": "sluice", "values": [1, 2, 3], "nested": {"ok": True}}, indent=2).encode()
    files = module.InferInput("file", [1], "BYTES")
    files.set_data_from_numpy(np.array([document], dtype=np.object_))
    result = client.infer("magika", [files], headers=headers)
    label = result.as_numpy("label")[0]
    check(label in (b"json", "json"), f"{flavour}: magika said {label!r}")

    # Triton's configuration and statistics extensions.
    config = client.get_model_config("digits-mlp", headers=headers)
    config = config if isinstance(config, dict) else {"max_batch_size": config.config.max_batch_size}
    config = config.get("config", config)
    check(config["max_batch_size"] > 0, f"{flavour}: model config {config}")
    stats = client.get_inference_statistics("digits-mlp", headers=headers)
    stats = stats if isinstance(stats, dict) else {"model_stats": [{"inference_count": stats.model_stats[0].inference_count}]}
    check(int(stats["model_stats"][0]["inference_count"]) >= len(labels), f"{flavour}: statistics {stats}")

    # Triton's model repository extension: the index, unload and load, readiness following.
    def states(index):
        rows = index if isinstance(index, list) else [{"name": m.name, "state": m.state} for m in index.models]
        return {row["name"]: row.get("state") for row in rows}

    index = states(client.get_model_repository_index(headers=headers))
    check(index.get("digits-mlp") == "READY" and index.get("digits") == "READY", f"{flavour}: index {index}")
    client.unload_model("digits-mlp", headers=headers)
    check(not client.is_model_ready("digits-mlp", headers=headers), f"{flavour}: ready after unload")
    check(states(client.get_model_repository_index(headers=headers))["digits-mlp"] == "UNAVAILABLE", f"{flavour}: index")
    expect_error(lambda: client.infer("digits-mlp", [x], headers=headers), "is unloaded")
    client.load_model("digits-mlp", headers=headers)
    check(client.is_model_ready("digits-mlp", headers=headers), f"{flavour}: not ready after load")
    result = client.infer("digits-mlp", [x], headers=headers)
    check(list(result.as_numpy("label")) == list(labels), f"{flavour}: plain model labels after load")

    # An error surfaces as the client's exception with Sluice's message.
    return expect_error(lambda: client.infer("no-such-model", [image], headers=headers), "model 'no-such-model' not found")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", required=True)
    parser.add_argument("--grpc", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--digits", required=True)
    args = parser.parse_args()

    heldout = json.load(open(args.digits))
    images = np.array(heldout["images"][:8], dtype=np.uint8)
    labels = np.array(heldout["labels"][:8], dtype=np.int64)

    http = httpclient.InferenceServerClient(url=args.http)
    http_error = run(http, httpclient, {"Authorization": f"Bearer {args.key}"}, images, labels, "http")
    # JSON tensors instead of binary, both ways.
    image = httpclient.InferInput("image", list(images.shape), "UINT8")
    image.set_data_from_numpy(images, binary_data=False)
    output = httpclient.InferRequestedOutput("label", binary_data=False)
    result = http.infer("digits", [image], outputs=[output], headers={"Authorization": f"Bearer {args.key}"})
    check(list(result.as_numpy("label")) == list(labels), "http: JSON tensors")
    # Compressed requests and responses.
    for algorithm in ("gzip", "deflate"):
        result = http.infer(
            "digits",
            [image],
            headers={"Authorization": f"Bearer {args.key}"},
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        check(list(result.as_numpy("label")) == list(labels), f"http: {algorithm} compression")

    grpc = grpcclient.InferenceServerClient(url=args.grpc)
    grpc_error = run(grpc, grpcclient, {"authorization": f"Bearer {args.key}"}, images, labels, "grpc")
    grpc_image = grpcclient.InferInput("image", list(images.shape), "UINT8")
    grpc_image.set_data_from_numpy(images)
    for algorithm in ("gzip", "deflate"):
        result = grpc.infer(
            "digits", [grpc_image], headers={"authorization": f"Bearer {args.key}"}, compression_algorithm=algorithm
        )
        check(list(result.as_numpy("label")) == list(labels), f"grpc: {algorithm} compression")
    stream(grpc, {"authorization": f"Bearer {args.key}"}, images, labels)
    print(f"http error: {http_error}\ngrpc error: {grpc_error}\ntritonclient checks passed")


def stream(client, headers, images, labels):
    """Triton's streaming extension: requests and answers on one stream, matched by id."""
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=headers)
    for index, image in enumerate(images):
        one = grpcclient.InferInput("image", [1, 64], "UINT8")
        one.set_data_from_numpy(image.reshape(1, 64))
        client.async_stream_infer("digits", [one], request_id=f"digit-{index}")
    missing = grpcclient.InferInput("image", [1, 64], "UINT8")
    missing.set_data_from_numpy(images[:1])
    client.async_stream_infer("no-such-model", [missing], request_id="missing")
    got, errors = {}, []
    for _ in range(len(images) + 1):
        result, error = answers.get(timeout=30)
        if error is not None:
            errors.append(str(error))
        else:
            got[result.get_response().id] = int(result.as_numpy("label")[0])
    client.stop_stream()
    check(got == {f"digit-{i}": int(label) for i, label in enumerate(labels)}, f"grpc stream: labels {got}")
    check(len(errors) == 1 and "model 'no-such-model' not found" in errors[0], f"grpc stream: errors {errors}")


if __name__ == "__main__":
    main()
