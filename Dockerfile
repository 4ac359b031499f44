# syntax=docker/dockerfile:1
# Sluice's image: `docker build -t sluice:0.1.0 .` (CPU: ONNX Runtime's CPU library on Debian)
# or, for GPUs (ONNX Runtime with its CUDA provider, on NVIDIA's CUDA 13 runtime with cuDNN 9):
#   docker build --build-arg ORT_FLAVOUR=gpu \
#     --build-arg RUNTIME_BASE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04 -t sluice:0.1.0-gpu .
# Both run as an unprivileged user, serve the tenant manifests in /opt/sluice/tenants
# (deploy/kubernetes mounts a ConfigMap there) and keep their cache in /var/lib/sluice. The
# example models are in /opt/sluice/models, the example components in /opt/sluice/components.

ARG ORT_VERSION=1.32.0
ARG ORT_GPU_VERSION=1.31.1
ARG RUNTIME_BASE=debian:bookworm-slim
# cpu | gpu: which ONNX Runtime library the image carries.
ARG ORT_FLAVOUR=cpu

FROM rust:1.95-bookworm AS build
ARG ORT_VERSION
ARG ORT_GPU_VERSION
ARG ORT_FLAVOUR
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-pip python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The build compiles the example components to wasm32-wasip2 (rust-toolchain.toml brings the
# target) and fetches the Magika model from PyPI.
RUN cargo build --release --locked -p sluice
RUN if [ "$ORT_FLAVOUR" = gpu ]; then package="onnxruntime-gpu==$ORT_GPU_VERSION" version=$ORT_GPU_VERSION; \
    else package="onnxruntime==$ORT_VERSION" version=$ORT_VERSION; fi \
    && python3 -m venv /venv \
    && /venv/bin/pip download --quiet --no-deps --only-binary=:all: -d /wheels "$package" \
    && mkdir -p /out/wheel /out/lib /out/models /out/components \
    && python3 -m zipfile -e /wheels/*.whl /out/wheel \
    && cp /out/wheel/onnxruntime/capi/libonnxruntime*.so* /out/lib/ \
    && ln -sf "libonnxruntime.so.$version" /out/lib/libonnxruntime.so \
    && rm -rf /wheels /out/wheel \
    && cp /src/target/release/sluice /out/sluice \
    && cp /src/examples/digits/model/digits.onnx /src/examples/digits/model/digits_small.onnx /out/models/ \
    && cp /src/examples/magika/model/model.onnx /out/models/magika.onnx \
    && cp /src/target/guests/wasm32-wasip2/release/digits.wasm \
          /src/target/guests/wasm32-wasip2/release/digits_http.wasm \
          /src/target/guests/wasm32-wasip2/release/magika.wasm \
          /src/target/guests/wasm32-wasip2/release/cascade.wasm /out/components/

FROM ${RUNTIME_BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/sluice sluice \
    && mkdir -p /opt/sluice/tenants /var/lib/sluice && chown sluice:sluice /var/lib/sluice
COPY --from=build /out/sluice /usr/local/bin/sluice
COPY --from=build /out/lib/ /opt/sluice/lib/
COPY --from=build /out/models /opt/sluice/models
COPY --from=build /out/components /opt/sluice/components
ENV ORT_DYLIB_PATH=/opt/sluice/lib/libonnxruntime.so \
    SLUICE_TENANTS=/opt/sluice/tenants SLUICE_DATA_DIR=/var/lib/sluice \
    SLUICE_HTTP=0.0.0.0:8000 SLUICE_GRPC=0.0.0.0:8001 SLUICE_METRICS=0.0.0.0:8002
USER 10001:10001
EXPOSE 8000 8001 8002
ENTRYPOINT ["sluice"]
CMD ["serve"]
