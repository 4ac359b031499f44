//! Host bindings for the tenant world (`wit/sluice.wit`), generated from the same `wit/`
//! folder the guest SDK uses. Kept private to the runtime and the `wasi:nn` host; the rest
//! of the host sees only chosen types.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "sluice:tenant/component",
    imports: {
        // Where a guest waits for the batcher: async, so the wait is cancellable.
        "wasi:nn/inference.[method]graph-execution-context.compute": async | trappable,
        // Loading raw bytes builds a graph off the async runtime.
        "wasi:nn/graph.load": async | trappable,
        default: trappable,
    },
    exports: { default: async },
    with: {
        "wasi:nn/tensor.tensor": crate::nn::host::HostTensor,
        "wasi:nn/graph.graph": crate::nn::host::HostGraph,
        "wasi:nn/inference.graph-execution-context": crate::nn::host::HostExecutionContext,
        "wasi:nn/errors.error": crate::nn::host::HostError,
    },
});
