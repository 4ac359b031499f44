//! The shared store on a real S3-compatible server (moto's server mode, started by the test
//! on a loopback port): blobs round-trip, and of many replicas writing the same version of a
//! tenant's control document at once exactly one wins — the conditional create the replicas'
//! no-lost-update rests on holds on S3, not only on a directory.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice::registry::shared::{SharedError, SharedStore};

use crate::support::*;

pub const MOTO: &str = "moto[server]==5.1.22";

/// A moto S3 server on a free loopback port, stopped on drop.
pub struct Moto {
    child: Child,
    pub endpoint: String,
}

impl Moto {
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("port").port();
        Self::start_on(port).await
    }

    /// A fresh (empty) server on `port`.
    pub async fn start_on(port: u16) -> Self {
        let python = python_with(&[MOTO]);
        let child = Command::new(python)
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts moto");
        let moto = Self { child, endpoint: format!("http://127.0.0.1:{port}") };
        let started = Instant::now();
        while reqwest::get(format!("{}/", moto.endpoint)).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "moto did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        moto
    }

    /// Create a bucket (moto accepts unsigned requests).
    pub async fn bucket(&self, name: &str) {
        let created = reqwest::Client::new().put(format!("{}/{name}", self.endpoint)).send().await.expect("moto");
        assert!(created.status().is_success(), "bucket {name}: {}", created.status());
    }

    /// The S3 settings a client of this server needs.
    pub fn settings(&self) -> [(&'static str, &str); 5] {
        [
            ("aws_endpoint", self.endpoint.as_str()),
            ("aws_allow_http", "true"),
            ("aws_access_key_id", "testing"),
            ("aws_secret_access_key", "testing"),
            ("aws_region", "us-east-1"),
        ]
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn on_s3_one_of_many_concurrent_writers_of_a_version_wins() {
    let moto = Moto::start().await;
    moto.bucket("sluice").await;
    let store = Arc::new(SharedStore::open_with("s3://sluice/replicas", &moto.settings()).expect("opens"));

    store.put_blob("cafe", Bytes::from_static(b"weights")).await.expect("stores");
    store.put_blob("cafe", Bytes::from_static(b"weights")).await.expect("stored already: fine");
    assert_eq!(store.get_blob("cafe").await.expect("reads").as_deref(), Some(&b"weights"[..]));
    assert_eq!(store.get_blob("beef").await.expect("reads"), None);

    for sequence in 1..=3u64 {
        let writers: Vec<_> = (0..16)
            .map(|writer| {
                let store = store.clone();
                tokio::spawn(async move {
                    let document = Bytes::from(format!("{{\"writer\":{writer}}}"));
                    store.write_control("acme", sequence, document).await.map(|()| writer)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for writer in writers {
            match writer.await.expect("joined") {
                Ok(writer) => winners.push(writer),
                Err(SharedError::Conflict { sequence: lost, .. }) => assert_eq!(lost, sequence),
                Err(other) => panic!("a writer failed otherwise: {other}"),
            }
        }
        assert_eq!(winners.len(), 1, "version {sequence}: exactly one writer wins, not {winners:?}");
        let stored = store.read_control("acme", sequence).await.expect("reads");
        assert_eq!(stored, Bytes::from(format!("{{\"writer\":{}}}", winners[0])), "the winner's document is stored");
    }
    assert_eq!(store.newest_versions(None).await.expect("lists").get("acme"), Some(&3));
}

const ADMIN: &str = "test-admin-token-replicas";
const KEY: &str = "test-key-replicas";

/// A replica of `s3://fleet/sluice` on `moto`, following the store every 200 ms.
fn replica(tenants: &std::path::Path, moto: &Moto) -> Server {
    let env = [
        ("AWS_ENDPOINT_URL", moto.endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
    ];
    let args = ["--store", "s3://fleet/sluice", "--store-poll-ms", "200", "--admin-token", ADMIN];
    Server::start_with_env(tenants, &args, &env)
}

/// How long until `check` holds on `server` (panics after 10 s).
async fn until(server: &Server, what: &str, check: impl AsyncFn(&Server) -> bool) -> Duration {
    let started = Instant::now();
    while !check(server).await {
        assert!(started.elapsed() < Duration::from_secs(10), "{what} never held:\n{}", server.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

fn plain_request() -> serde_json::Value {
    serde_json::json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }] })
}

async fn admin(
    server: &Server,
    method: reqwest::Method,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    server.send(method, path, ADMIN, if body.is_null() { Vec::new() } else { body.to_string().into_bytes() }).await
}

#[tokio::test]
async fn replicas_on_one_s3_store_converge_lose_no_update_and_restore_at_start() {
    let moto = Moto::start().await;
    moto.bucket("fleet").await;
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "max_stored_bytes = 100000000");
    manifest += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &manifest);
    let replicas: Vec<Server> = (0..3).map(|_| replica(tenants.path(), &moto)).collect();

    // An upload through replica 1 serves from replicas 2 and 3.
    let weights = std::fs::read(digits_model()).expect("weights");
    let (code, body) = replicas[0].send(reqwest::Method::PUT, "/control/v1/models/digits-mlp", KEY, weights).await;
    assert_eq!(code, 201, "{body}");
    for other in &replicas[1..] {
        let took = until(other, "the uploaded model serves", async |s: &Server| {
            s.infer("digits-mlp", KEY, &plain_request()).await.0 == 200
        })
        .await;
        println!("upload converged in {took:?}");
    }

    // A new app version and a traffic change through replica 1 serve from replica 3.
    let component = std::fs::read(guest("digits")).expect("component");
    let (code, body) =
        replicas[0].send(reqwest::Method::PUT, "/control/v1/apps/digits/versions/2", KEY, component).await;
    assert_eq!(code, 201, "{body}");
    let traffic = serde_json::json!({ "stable": "2" }).to_string().into_bytes();
    let (code, body) = replicas[0].send(reqwest::Method::PUT, "/control/v1/apps/digits/traffic", KEY, traffic).await;
    assert_eq!(code, 200, "{body}");
    let (pixels, _) = &heldout_digits()[0];
    let digit = image_request(pixels, &[1, 64]);
    until(&replicas[2], "version 2 is stable", async |s: &Server| {
        let (code, answer) = s.infer("digits", KEY, &digit).await;
        code == 200 && answer["model_version"] == "2"
    })
    .await;

    // Changes to one tenant through two replicas at once all survive: keys issued through
    // replicas 1 and 2, and a quota change, concurrently.
    let quotas = serde_json::json!({ "max_concurrent_requests": 7, "max_stored_bytes": 100_000_000 });
    let (quota_change, issued) = tokio::join!(
        admin(&replicas[1], reqwest::Method::PUT, "/admin/v1/tenants/acme/quotas", quotas),
        futures::future::join_all((0..8).map(|i| {
            admin(&replicas[i % 2], reqwest::Method::POST, "/admin/v1/tenants/acme/keys", serde_json::Value::Null)
        })),
    );
    assert_eq!(quota_change.0, 200, "{}", quota_change.1);
    let keys: Vec<String> = issued
        .into_iter()
        .map(|(code, body)| {
            assert_eq!(code, 201, "{body}");
            body["key"].as_str().expect("a key").to_string()
        })
        .collect();
    for key in &keys {
        until(&replicas[2], "every issued key works", async |s: &Server| {
            s.infer("digits-mlp", key, &plain_request()).await.0 == 200
        })
        .await;
    }
    let (code, listed) = admin(&replicas[2], reqwest::Method::GET, "/admin/v1/tenants", serde_json::Value::Null).await;
    assert_eq!(code, 200);
    let acme = listed.as_array().expect("tenants").iter().find(|t| t["id"] == "acme").expect("acme").clone();
    assert_eq!(acme["quotas"]["max_concurrent_requests"], 7, "the quota change survived beside the keys: {acme}");

    let redone = replicas[..2].iter().map(|r| r.log().matches("the change made again").count()).sum::<usize>();
    println!("saves made again on another replica's version: {redone}");

    // A replica started afresh (empty data directory) serves it all from the store at once.
    let fresh = replica(tenants.path(), &moto);
    assert_eq!(fresh.infer("digits-mlp", &keys[0], &plain_request()).await.0, 200);
    let (code, answer) = fresh.infer("digits", KEY, &digit).await;
    assert_eq!((code, answer["model_version"].as_str()), (200, Some("2")), "{answer}");
}

#[tokio::test]
async fn a_replica_serves_through_a_store_outage_and_one_that_never_read_the_store_is_not_ready() {
    let moto = Moto::start().await;
    moto.bucket("fleet").await;
    let port: u16 = moto.endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    tenants.write("acme.toml", &manifest);
    let serving = replica(tenants.path(), &moto);
    let ready = async |server: &Server| server.get("/v2/health/ready", None).await.0;
    assert_eq!(ready(&serving).await, 200);

    // The store goes away: the replica keeps serving and stays ready, and says so.
    let endpoint = moto.endpoint.clone();
    drop(moto);
    until(&serving, "a failed read of the store is counted", async |s: &Server| {
        s.metric("sluice_store_errors_total").await >= 1.0
    })
    .await;
    assert_eq!(serving.infer("digits-mlp", KEY, &plain_request()).await.0, 200);
    assert_eq!(ready(&serving).await, 200, "a replica that has read the store stays ready");
    assert!(serving.log().contains("the shared store could not be read"), "{}", serving.log());

    // A replica started now has never read it: it serves its manifests and is not ready.
    let stranded = replica(tenants.path(), &Moto { child: dead_child(), endpoint });
    assert_eq!(ready(&stranded).await, 503);
    assert_eq!(stranded.infer("digits-mlp", KEY, &plain_request()).await.0, 200);

    // The store comes back (empty, as moto starts): ready within a few polls.
    let back = Moto::start_on(port).await;
    back.bucket("fleet").await;
    until(&stranded, "ready once the store is read", async |s: &Server| s.get("/v2/health/ready", None).await.0 == 200)
        .await;
}

/// A child that has exited, for a `Moto` whose server is gone.
fn dead_child() -> Child {
    let mut child = Command::new("true").spawn().expect("true");
    let _ = child.wait();
    child
}
