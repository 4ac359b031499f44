//! The floor server: what the protocols alone cost, as the same-run reference for Sluice's
//! end-to-end figures (`scripts/bench_overhead.sh`); its handlers are in `floor_server/`.
//!
//! With `--sluice-listener` it accepts and serves connections as `sluice serve` does (its
//! connection caps, header timeout and drain), so that what Sluice's own connection handling
//! costs shows beside the plain crates'.
//!
//! With `--hop` each answer comes from another task (a spawned task, over a oneshot channel),
//! as Sluice's answers come from a model queue: the connection's task goes idle and is woken.
//!
//! With `--busy-us=N` each request keeps the CPU busy for N µs before it is answered, so that
//! the floor serves at the throughput of a slower path (the `digits` app's) and what the
//! network costs per request is measured at that throughput: a client waiting longer for its
//! answers sleeps more, and waking it is paid in the server's writes on the loopback.
//!
//! Run: `cargo bench --bench floor -- HTTP_ADDRESS GRPC_ADDRESS [--sluice-listener] [--hop]
//! [--busy-us=N]`
//! (serves until killed).

use std::net::SocketAddr;

use std::future::pending;
use std::time::Duration;

use axum::serve::ListenerExt;
use sluice::serve::listen::{self, ConnectionLimits, ConnectionSettings};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

/// The drain timeout (never reached: the floor serves until killed).
const DRAIN: Duration = Duration::from_secs(1);

mod floor_server;

use floor_server::{Answering, Hop};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let (addresses, flags): (Vec<&String>, Vec<&String>) = args.iter().partition(|a| !a.starts_with("--"));
    let busy_us = flags.iter().find_map(|f| f.strip_prefix("--busy-us=")).map(str::parse::<u64>).transpose()?;
    let known = |f: &str| ["--sluice-listener", "--hop"].contains(&f) || f.starts_with("--busy-us=");
    let ([http, grpc], true) = (addresses.as_slice(), flags.iter().all(|f| known(f))) else {
        anyhow::bail!(
            "usage: cargo bench --bench floor -- HTTP_ADDRESS GRPC_ADDRESS [--sluice-listener] [--hop] [--busy-us=N]"
        );
    };
    let sluice_listener = flags.iter().any(|f| *f == "--sluice-listener");
    let hop = if flags.iter().any(|f| *f == "--hop") { Hop::Task } else { Hop::None };
    let answering = Answering { busy: Duration::from_micros(busy_us.unwrap_or(0)), ..hop.into() };
    let (http, grpc): (SocketAddr, SocketAddr) = (http.parse()?, grpc.parse()?);
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async move {
        let (listener, grpc_listener) = (TcpListener::bind(http).await?, TcpListener::bind(grpc).await?);
        println!("floor listening on {http} (HTTP) and {grpc} (gRPC)");
        let grpc_server = tonic::transport::Server::builder().add_service(floor_server::grpc_service(answering));
        if sluice_listener {
            // Sluice's own connection handling (caps, header timeout, TCP_NODELAY, drain):
            // what it adds to the floor is its cost.
            let limits = ConnectionLimits::new(ConnectionSettings::default());
            let incoming = listen::incoming(grpc_listener, limits.clone(), "grpc");
            let http_server =
                listen::serve_http(listener, floor_server::http_router(answering), limits, pending(), DRAIN);
            let (_, grpc_served) = tokio::join!(http_server, grpc_server.serve_with_incoming(incoming));
            grpc_served?;
        } else {
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let incoming = TcpIncoming::from(grpc_listener).with_nodelay(Some(true));
            let http_server = axum::serve(listener, floor_server::http_router(answering));
            let (served, grpc_served) =
                tokio::join!(http_server.into_future(), grpc_server.serve_with_incoming(incoming));
            served?;
            grpc_served?;
        }
        anyhow::Ok(())
    })
}
