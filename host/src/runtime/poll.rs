//! `wasi:io/poll` for tenant guests: wasmtime-wasi's own, except that a guest waiting in
//! `poll` or `pollable.block` (a sleep, a timer) gives its CPU turn up for the wait and takes
//! one again in round robin after it, like a guest waiting for a model. Without it, guests
//! sleeping in a host call hold turns that other tenants' requests wait for.
//!
//! Linked over wasmtime-wasi's functions of the same names (shadowing them in the linker).

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::io::poll;

use super::store::StoreState;
use crate::nn::host::CpuTurn;

/// The per-call view: the store's resource table and the request's turn.
pub struct PollView<'a> {
    table: &'a mut ResourceTable,
    turn: &'a mut dyn CpuTurn,
}

struct Polling;

impl HasData for Polling {
    type Data<'a> = PollView<'a>;
}

/// Replace `wasi:io/poll` in a linker that has wasmtime-wasi's.
pub fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let added = poll::add_to_linker::<StoreState, Polling>(linker, |state| PollView {
        table: &mut state.table,
        turn: &mut *state.nn.turn,
    });
    linker.allow_shadowing(false);
    added
}

impl poll::Host for PollView<'_> {
    async fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        self.turn.pause();
        let ready = poll::Host::poll(self.table, pollables).await;
        self.turn.resume().await;
        ready
    }
}

impl poll::HostPollable for PollView<'_> {
    async fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        self.turn.pause();
        let ready = poll::HostPollable::block(self.table, pollable).await;
        self.turn.resume().await;
        ready
    }

    async fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        poll::HostPollable::ready(self.table, pollable).await
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        poll::HostPollable::drop(self.table, pollable)
    }
}
