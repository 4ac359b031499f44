//! Host bindings for the tenant world (`wit/sluice.wit`), generated from the same `wit/`
//! folder the guest SDK uses. Kept private to the runtime; the rest of the host sees only
//! chosen types.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "sluice:tenant/component",
    imports: { default: trappable },
    exports: { default: async },
    // wasi:nn's bindings are nn's own (generated beside the host implementation).
    with: {
        "wasi:nn/tensor": crate::nn::host::bindings::wasi::nn::tensor,
        "wasi:nn/graph": crate::nn::host::bindings::wasi::nn::graph,
        "wasi:nn/inference": crate::nn::host::bindings::wasi::nn::inference,
        "wasi:nn/errors": crate::nn::host::bindings::wasi::nn::errors,
    },
});
