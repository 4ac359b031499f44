# syntax=docker/dockerfile:1
# Sluice's image: `docker build -t sluice:0.1.0 .` (CPU, ONNX Runtime's CPU library) or
# `docker build --target gpu -t sluice:0.1.0-gpu .` (ONNX Runtime with its CUDA provider, on
# NVIDIA's CUDA 13 runtime with cuDNN 9). Both run as an unprivileged user, serve the tenant
# manifests in /opt/sluice/tenants (deploy/kubernetes mounts a ConfigMap there) and keep their
# cache in /var/lib/sluice. The example models are in /opt/sluice/models, the example
# components in /opt/sluice/components.

ARG ORT_VERSION=1.32.0
ARG ORT_GPU_VERSION=1.31.1

FROM rust:1.95-bookworm AS build
ARG ORT_VERSION
ARG ORT_GPU_VERSION
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-pip python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The build compiles the example components to wasm32-wasip2 (rust-toolchain.toml brings the
# target) and fetches the Magika model from PyPI.
RUN cargo build --release --locked -p sluice
RUN python3 -m venv /venv \
    && /venv/bin/pip download --quiet --no-deps --only-binary=:all: -d /wheels \
        "onnxruntime==${ORT_VERSION}" "onnxruntime-gpu==${ORT_GPU_VERSION}" \
    && mkdir -p /out/wheels/cpu /out/wheels/gpu /out/cpu /out/gpu /out/models /out/components \
    && python3 -m zipfile -e /wheels/onnxruntime-${ORT_VERSION}-*.whl /out/wheels/cpu \
    && python3 -m zipfile -e /wheels/onnxruntime_gpu-${ORT_GPU_VERSION}-*.whl /out/wheels/gpu \
    && cp /out/wheels/cpu/onnxruntime/capi/libonnxruntime.so.${ORT_VERSION} /out/cpu/ \
    && cp /out/wheels/gpu/onnxruntime/capi/libonnxruntime*.so* /out/gpu/ \
    && rm -rf /wheels /out/wheels \
    && cp /src/target/release/sluice /out/sluice \
    && cp /src/examples/digits/model/digits.onnx /src/examples/digits/model/digits_small.onnx /out/models/ \
    && cp /src/examples/magika/model/model.onnx /out/models/magika.onnx \
    && cp /src/target/guests/wasm32-wasip2/release/digits.wasm \
          /src/target/guests/wasm32-wasip2/release/magika.wasm \
          /src/target/guests/wasm32-wasip2/release/cascade.wasm /out/components/

FROM nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04 AS gpu
ARG ORT_GPU_VERSION
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/sluice sluice \
    && mkdir -p /opt/sluice/tenants /var/lib/sluice && chown sluice:sluice /var/lib/sluice
COPY --from=build /out/sluice /usr/local/bin/sluice
COPY --from=build /out/gpu/ /opt/sluice/lib/
COPY --from=build /out/models /opt/sluice/models
COPY --from=build /out/components /opt/sluice/components
ENV ORT_DYLIB_PATH=/opt/sluice/lib/libonnxruntime.so.${ORT_GPU_VERSION} \
    SLUICE_TENANTS=/opt/sluice/tenants SLUICE_DATA_DIR=/var/lib/sluice \
    SLUICE_HTTP=0.0.0.0:8000 SLUICE_GRPC=0.0.0.0:8001 SLUICE_METRICS=0.0.0.0:8002
USER 10001:10001
EXPOSE 8000 8001 8002
ENTRYPOINT ["sluice"]
CMD ["serve"]

FROM debian:bookworm-slim AS cpu
ARG ORT_VERSION
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/sluice sluice \
    && mkdir -p /opt/sluice/tenants /var/lib/sluice && chown sluice:sluice /var/lib/sluice
COPY --from=build /out/sluice /usr/local/bin/sluice
COPY --from=build /out/cpu/ /opt/sluice/lib/
COPY --from=build /out/models /opt/sluice/models
COPY --from=build /out/components /opt/sluice/components
ENV ORT_DYLIB_PATH=/opt/sluice/lib/libonnxruntime.so.${ORT_VERSION} \
    SLUICE_TENANTS=/opt/sluice/tenants SLUICE_DATA_DIR=/var/lib/sluice \
    SLUICE_HTTP=0.0.0.0:8000 SLUICE_GRPC=0.0.0.0:8001 SLUICE_METRICS=0.0.0.0:8002
USER 10001:10001
EXPOSE 8000 8001 8002
ENTRYPOINT ["sluice"]
CMD ["serve"]
