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
    // A blob larger than one part (10 MiB) goes up in parts from its file and comes back whole.
    let large: Vec<u8> = (0..12u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let file = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(file.path(), &large).expect("writes");
    store.put_blob_file("large", file.path()).await.expect("stores in parts");
    assert!(store.get_blob("large").await.expect("reads").is_some_and(|bytes| bytes == large), "the same bytes");

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
    replica_polling(tenants, moto, "200")
}

/// A replica of `s3://fleet/sluice` on `moto`, following the store every `poll_ms`.
fn replica_polling(tenants: &std::path::Path, moto: &Moto, poll_ms: &str) -> Server {
    let env = [
        ("AWS_ENDPOINT_URL", moto.endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
    ];
    let args = ["--store", "s3://fleet/sluice", "--store-poll-ms", poll_ms, "--admin-token", ADMIN];
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
    // replicas 1 and 2, and two quota changes, one through each, concurrently.
    let quota = async |server: &Server, fields: serde_json::Value| {
        admin(server, reqwest::Method::PATCH, "/admin/v1/tenants/acme/quotas", fields).await
    };
    let (first_quota, second_quota, issued) = tokio::join!(
        quota(&replicas[0], serde_json::json!({ "max_concurrent_requests": 7 })),
        quota(&replicas[1], serde_json::json!({ "max_requests_per_second": 5000 })),
        futures::future::join_all((0..8).map(|i| {
            admin(&replicas[i % 2], reqwest::Method::POST, "/admin/v1/tenants/acme/keys", serde_json::Value::Null)
        })),
    );
    assert_eq!(first_quota.0, 200, "{}", first_quota.1);
    assert_eq!(second_quota.0, 200, "{}", second_quota.1);
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
    let quotas = &acme["quotas"];
    assert_eq!(
        (&quotas["max_concurrent_requests"], &quotas["max_requests_per_second"], &quotas["max_stored_bytes"]),
        (&serde_json::json!(7), &serde_json::json!(5000), &serde_json::json!(100_000_000)),
        "both quota changes survived beside the keys, and the manifest's other quotas: {acme}"
    );

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
    until(&serving, "a failed read of the store is counted and logged", async |s: &Server| {
        s.metric("sluice_store_errors_total").await >= 1.0 && s.log().contains("the shared store could not be read")
    })
    .await;
    assert_eq!(serving.infer("digits-mlp", KEY, &plain_request()).await.0, 200);
    assert_eq!(ready(&serving).await, 200, "a replica that has read the store stays ready");
    // A change it cannot save is refused and leaves nothing behind: a tenant created now
    // is not there after the failure.
    let initech = serde_json::json!({ "id": "initech", "quotas": {} });
    let (code, body) = admin(&serving, reqwest::Method::POST, "/admin/v1/tenants", initech).await;
    assert_eq!(code, 500, "{body}");
    assert!(!body.to_string().contains("127.0.0.1"), "the store's endpoint stays in the log: {body}");
    let (_, listed) = admin(&serving, reqwest::Method::GET, "/admin/v1/tenants", serde_json::Value::Null).await;
    assert!(listed.as_array().expect("tenants").iter().all(|t| t["id"] != "initech"), "{listed}");

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

/// A canary app analysed across replicas, with an SLO, beside a model whose drift is tracked.
fn fleet_manifest() -> String {
    let mut manifest = tenant_header("acme", KEY, "max_concurrent_requests = 64");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += "[models.digits-mlp.drift]\nsample_rate = 1.0\nmax_samples_per_second = 100000\n\
                 reference_rows = 20\nwindow_rows = 20\n\n";
    // Both versions are the same component: only the request counts move the canary.
    manifest += &format!(
        "[apps.hostile]\nstable = \"1\"\nversions.\"1\".component = \"{0}\"\nversions.\"2\".component = \"{0}\"\n\
         [apps.hostile.traffic]\ncanary = {{ version = \"2\", weight = 50 }}\n\
         [apps.hostile.analysis]\ninterval_ms = 300\nmin_requests = 20\nsteps = [50, 60, 70, 80, 90, 100]\n\
         max_error_rate_increase = 1.0\nmax_p99_ratio = 1000\n\
         [apps.hostile.slo]\navailability = 0.99\nlatency_ms = 1000\n",
        guest("hostile_guest").display()
    );
    manifest
}

fn echo() -> serde_json::Value {
    serde_json::json!({ "inputs": [{ "name": "x", "shape": [1], "datatype": "INT32", "data": [1] }], "parameters": { "mode": "echo" } })
}

/// The index of the replica holding the analysis lease, once one does (the one that
/// announced it last).
async fn lease_holder(replicas: &[Server]) -> usize {
    let started = Instant::now();
    loop {
        let holders: Vec<usize> = (0..replicas.len())
            .filter(|&i| {
                let log = replicas[i].log();
                let took = log.rfind("holds the analysis lease");
                took.is_some() && took > log.rfind("no longer holds the analysis lease")
            })
            .collect();
        if let [holder] = holders.as_slice() {
            return *holder;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "no single lease holder: {holders:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The app's status (traffic, events, SLO) as `server` reports it.
async fn hostile_status(server: &Server) -> serde_json::Value {
    let (code, status) = server.get("/control/v1/apps/hostile", Some(KEY)).await;
    assert_eq!(code, 200, "{status}");
    status
}

fn decisions_after(status: &serde_json::Value, unix_ms: u64) -> Vec<serde_json::Value> {
    let events = status["events"].as_array().cloned().unwrap_or_default();
    events.into_iter().filter(|e| e["action"] != "wait" && e["unix_ms"].as_u64() > Some(unix_ms)).collect()
}

/// Send echo requests to `targets` in turn until `done` holds on `watch` (20 s at most).
async fn traffic_until(targets: &[&Server], watch: &Server, what: &str, done: impl Fn(&serde_json::Value) -> bool) {
    let started = Instant::now();
    let request = echo();
    loop {
        for target in targets {
            let round = (0..10).map(|_| target.infer("hostile", KEY, &request));
            for (code, body) in futures::future::join_all(round).await {
                assert_eq!(code, 200, "{body}");
            }
        }
        let status = hostile_status(watch).await;
        if done(&status) {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{what} never held: {status}");
    }
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64
}

#[tokio::test]
async fn the_lease_holder_analyses_every_replicas_traffic_and_a_killed_one_is_replaced_and_nothing_is_lost() {
    let moto = Moto::start().await;
    moto.bucket("fleet").await;
    let tenants = Tenants::new();
    tenants.write("acme.toml", &fleet_manifest());
    let mut replicas: Vec<Server> = (0..3).map(|_| replica(tenants.path(), &moto)).collect();
    let holder = lease_holder(&replicas).await;
    let followers: Vec<usize> = (0..3).filter(|&i| i != holder).collect();

    // Traffic to the two followers only: the holder, which got none, promotes the canary on
    // their counts, and the followers show its decision.
    let started = unix_ms_now();
    let targets = [&replicas[followers[0]], &replicas[followers[1]]];
    traffic_until(&targets, targets[0], "a promotion on the followers' traffic", |status| {
        !decisions_after(status, started).is_empty()
    })
    .await;
    until(targets[1], "the other follower shows the decision", async |s: &Server| {
        !decisions_after(&hostile_status(s).await, started).is_empty()
    })
    .await;
    let first = decisions_after(&hostile_status(targets[1]).await, started)[0].clone();
    assert_eq!((first["action"].as_str(), first["weight_after"].as_f64()), (Some("promote"), Some(60.0)), "{first}");
    assert!(first["canary"]["requests"].as_u64() >= Some(20), "{first}");

    // The holder is killed mid-traffic: a follower takes the lease within two lease periods
    // (2 s each at a 200 ms poll) and the analysis goes on to completion.
    let killed_at = unix_ms_now();
    let stopped = Instant::now();
    let load = {
        let targets: Vec<String> = followers.iter().map(|&i| replicas[i].base.clone()).collect();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut answered = 0;
            while stopped.elapsed() < Duration::from_secs(5) {
                for base in &targets {
                    let sent =
                        client.post(format!("{base}/v2/models/hostile/infer")).bearer_auth(KEY).json(&echo()).send();
                    answered += usize::from(sent.await.is_ok_and(|r| r.status() == 200));
                }
            }
            answered
        })
    };
    drop(replicas.remove(holder));
    let survivors: Vec<Server> = replicas;
    let new_holder = lease_holder(&survivors).await;
    let took_over = stopped.elapsed();
    println!("the lease moved in {took_over:?}");
    assert!(took_over < Duration::from_secs(4) + Duration::from_millis(500), "took {took_over:?}");
    assert!(load.await.expect("joins") > 0, "the survivors served throughout");
    let other = 1 - new_holder;
    let both = [&survivors[0], &survivors[1]];
    traffic_until(&both, &survivors[other], "completion after the takeover", |status| status["stable"] == "2").await;
    until(&survivors[other], "the new holder's completion shows", async |s: &Server| {
        decisions_after(&hostile_status(s).await, killed_at).iter().any(|e| e["action"] == "complete")
    })
    .await;

    // SLO counts and the drift reference, then every replica gone: a fresh one restores both.
    let trap = serde_json::json!({ "inputs": [], "parameters": { "mode": "trap" } });
    for _ in 0..5 {
        assert_eq!(survivors[other].infer("hostile", KEY, &trap).await.0, 500);
    }
    let rows: Vec<f32> =
        heldout_digits().iter().take(25).flat_map(|(p, _)| p.iter().map(|&v| f32::from(v) / 255.0)).collect();
    let drift_rows =
        serde_json::json!({ "inputs": [{ "name": "X", "shape": [25, 64], "datatype": "FP32", "data": rows }] });
    assert_eq!(survivors[other].infer("digits-mlp", KEY, &drift_rows).await.0, 200);
    let slo_of = |status: &serde_json::Value| (status["slo"][0]["requests"].as_u64(), status["slo"][0]["bad"].as_u64());
    // Both survivors agree on the fleet's counts once the holder has read both.
    until(&survivors[new_holder], "the survivors agree on the SLO counts", async |s: &Server| {
        let (mine, theirs) = (slo_of(&hostile_status(s).await), slo_of(&hostile_status(&survivors[other]).await));
        mine == theirs && mine.1 == Some(5)
    })
    .await;
    let agreed = slo_of(&hostile_status(&survivors[new_holder]).await);
    assert!(agreed.0 > Some(100), "every replica's requests count: {agreed:?}");
    until(&survivors[other], "the drift reference is complete", async |s: &Server| {
        s.get("/v2/models/digits-mlp/drift", Some(KEY)).await.1["status"] == "ready"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    drop(survivors);

    let fresh = replica(tenants.path(), &moto);
    until(&fresh, "the SLO counts are restored", async |s: &Server| slo_of(&hostile_status(s).await) == agreed).await;
    // Five rows would be a reference of five, still collecting; the stored one has twenty.
    let rows: Vec<f32> =
        heldout_digits().iter().take(5).flat_map(|(p, _)| p.iter().map(|&v| f32::from(v) / 255.0)).collect();
    let five_rows =
        serde_json::json!({ "inputs": [{ "name": "X", "shape": [5, 64], "datatype": "FP32", "data": rows }] });
    // Three calls of five rows cannot fill a reference of twenty: a full one is the stored one.
    let mut report = serde_json::Value::Null;
    for _ in 0..3 {
        assert_eq!(fresh.infer("digits-mlp", KEY, &five_rows).await.0, 200);
        tokio::time::sleep(Duration::from_millis(700)).await;
        report = fresh.get("/v2/models/digits-mlp/drift", Some(KEY)).await.1;
        if report["reference_rows"] == 20 && report["status"] == "ready" {
            break;
        }
    }
    assert!(report["reference_rows"] == 20 && report["status"] == "ready", "the drift reference was lost: {report}");
    until(&fresh, "the analysis' events are restored", async |s: &Server| {
        decisions_after(&hostile_status(s).await, 0).iter().any(|e| e["action"] == "complete")
    })
    .await;
}

/// A replica applies what the others saved: another tenant's uploads that take long to load
/// (graphs of many small nodes, seconds each) are made before the replica takes the lock its
/// control changes take, so this tenant's changes there never wait for them.
#[tokio::test]
async fn a_replica_applying_another_tenants_slow_uploads_keeps_this_ones_changes_waiting_for_none() {
    use std::sync::atomic::{AtomicBool, Ordering};

    const OTHER: &str = "test-key-replicas-globex";
    let moto = Moto::start().await;
    moto.bucket("fleet").await;
    let tenants = Tenants::new();
    tenants.write("acme.toml", &(tenant_header("acme", KEY, "") + &app_entry("digits", &guest("digits"))));
    let quotas = "max_resident_model_mib = 8192\nmax_models = 64\nmax_model_bytes = 100000000\n\
                  max_stored_bytes = 1000000000";
    tenants.write("globex.toml", &tenant_header("globex", OTHER, quotas));
    let uploading = replica(tenants.path(), &moto);
    let applying = Arc::new(replica(tenants.path(), &moto));

    // This tenant changes its traffic through the applying replica, one change after another.
    let stop = Arc::new(AtomicBool::new(false));
    let changes = {
        let (applying, stop) = (applying.clone(), stop.clone());
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            let traffic = serde_json::json!({ "stable": "1" }).to_string().into_bytes();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let path = "/control/v1/apps/digits/traffic";
                let (code, body) = applying.send(reqwest::Method::PUT, path, KEY, traffic.clone()).await;
                assert_eq!(code, 200, "{body}");
                slowest = slowest.max(started.elapsed());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            slowest
        })
    };
    // The other tenant uploads three models through the other replica, and a component.
    let mut alone = Duration::MAX;
    for i in 0..3 {
        let started = Instant::now();
        let model = crate::onnx::add_chain(20_000 + i);
        let path = format!("/control/v1/models/chain-{i}");
        let (code, body) = uploading.send(reqwest::Method::PUT, &path, OTHER, model).await;
        assert_eq!(code, 201, "{body}");
        alone = alone.min(started.elapsed());
    }
    let component = std::fs::read(guest("echo_guest")).expect("component");
    let (code, body) = uploading.send(reqwest::Method::PUT, "/control/v1/apps/echo/versions/1", OTHER, component).await;
    assert_eq!(code, 201, "{body}");
    let x = serde_json::json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0] }] });
    until(&applying, "the other tenant's uploads serve", async |s: &Server| {
        s.infer("chain-2", OTHER, &x).await.0 == 200 && s.get("/control/v1/apps/echo", Some(OTHER)).await.0 == 200
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let slowest = changes.await.expect("the changes");
    assert!(alone > Duration::from_millis(400), "a chain of 20,000 nodes loaded in {alone:?}");
    assert!(
        slowest < alone / 2,
        "a traffic change took {slowest:?} while the replica applied uploads that load in {alone:?}"
    );

    // Deleted through the uploading replica, the models leave the applying one's disk too:
    // its cached blobs and their optimised forms.
    use sha2::Digest;
    let data = applying.data_dir().expect("its own data directory");
    let blob = |i: usize| {
        data.join("registry/blobs/sha256").join(hex::encode(sha2::Sha256::digest(crate::onnx::add_chain(20_000 + i))))
    };
    assert!(blob(0).exists(), "the applying replica fetched the blob");
    for i in 0..3 {
        let path = format!("/control/v1/models/chain-{i}");
        let (code, body) = uploading.send(reqwest::Method::DELETE, &path, OTHER, Vec::new()).await;
        assert_eq!(code, 200, "{body}");
    }
    until(&applying, "the deletions are applied", async |s: &Server| s.infer("chain-2", OTHER, &x).await.0 == 404)
        .await;
    assert!((0..3).all(|i| !blob(i).exists()), "the deleted models' blobs are gone");
    let optimized = std::fs::read_dir(data.join("optimized")).expect("optimised models").count();
    assert_eq!(optimized, 0, "and their optimised forms");
}

#[tokio::test]
async fn what_a_replica_catching_up_drops_leaves_its_disk() {
    use sha2::Digest;
    let moto = Moto::start().await;
    moto.bucket("fleet").await;
    let tenants = Tenants::new();
    let quotas = "max_stored_bytes = 100000000";
    tenants.write("acme.toml", &(tenant_header("acme", KEY, quotas) + &app_entry("digits", &guest("digits"))));
    let deleting = replica(tenants.path(), &moto);
    // This one reads the store only when it starts and when one of its saves loses to another.
    let behind = replica_polling(tenants.path(), &moto, "3600000");
    let x = serde_json::json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0] }] });
    let chain = crate::onnx::add_chain(64);
    let (code, body) = behind.send(reqwest::Method::PUT, "/control/v1/models/chain", KEY, chain.clone()).await;
    assert_eq!(code, 201, "{body}");
    until(&deleting, "the upload serves", async |s: &Server| s.infer("chain", KEY, &x).await.0 == 200).await;
    let (code, body) = deleting.send(reqwest::Method::DELETE, "/control/v1/models/chain", KEY, Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    // A change through the replica that has not seen the deletion loses its save, takes the
    // deletion, and is made again on it.
    let traffic = serde_json::json!({ "stable": "1" }).to_string().into_bytes();
    let (code, body) = behind.send(reqwest::Method::PUT, "/control/v1/apps/digits/traffic", KEY, traffic).await;
    assert_eq!(code, 200, "{body}");
    assert!(behind.log().contains("the change made again"), "the save was not lost:\n{}", behind.log());
    assert_eq!(behind.infer("chain", KEY, &x).await.0, 404, "the deletion is applied");
    let data = behind.data_dir().expect("its own data directory");
    let blob = data.join("registry/blobs/sha256").join(hex::encode(sha2::Sha256::digest(&chain)));
    assert!(!blob.exists(), "the deleted model's blob is left on the disk of the replica that caught up");
    let optimized = std::fs::read_dir(data.join("optimized")).expect("optimised models").count();
    assert_eq!(optimized, 0, "and its optimised form");
}
