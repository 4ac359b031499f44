//! Uploads cost what they should and leave the state consistent: a component of another
//! world is refused before it is compiled (no compile time, no compiled artifact); an upload
//! that cannot be saved (the disk is full) is answered with an error and does not serve,
//! before or after a restart, and leaves no temp file.

use std::path::Path;
use std::process::Command;

use reqwest::Method;

use crate::support::*;

const KEY: &str = "test-key-acme";

fn tenants() -> Tenants {
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "max_component_bytes = 100000000\nmax_model_bytes = 10000000");
    manifest += &model_entry("digits-mlp", &digits_model(), None);
    manifest += &app_entry("digits", &guest("digits"));
    tenants.write("acme.toml", &manifest);
    tenants
}

async fn versions(server: &Server) -> Vec<String> {
    let (code, body) = server.get("/control/v1/apps/digits", Some(KEY)).await;
    assert_eq!(code, 200, "{body}");
    body["versions"].as_object().expect("versions").keys().cloned().collect()
}

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| entries.count())
}

#[tokio::test]
async fn a_component_of_another_world_is_refused_before_it_is_compiled() {
    let tenants = tenants();
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    let compiled = files_in(&data.path().join("compiled"));
    let cpu = server.cpu_time();
    let other_world = std::fs::read(guest("other_world_guest")).expect("the wasi:cli/command component");
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/digits/versions/2", KEY, other_world).await;
    assert_eq!(code, 400, "{body}");
    let spent = server.cpu_time().saturating_sub(cpu);
    assert_eq!(files_in(&data.path().join("compiled")), compiled, "no compiled artifact was left");
    assert_eq!(files_in(&data.path().join("registry/blobs/sha256")), 0, "nothing was stored");
    assert!(spent.as_millis() < 60, "refusing it took {spent:?} of server CPU");
    assert!(error_message(&body).contains("wasi:cli/run"), "the message says what it is instead: {body}");
    for world in ["sluice:tenant/component", "wasi:http/proxy"] {
        assert!(error_message(&body).contains(world), "the message names the worlds accepted: {body}");
    }
    assert_eq!(versions(&server).await, ["1"]);
}

/// A tmpfs of `mib` MiB mounted at `dir` for the test's life (the full-disk case needs a
/// file system that fills up).
struct Mounted<'a>(&'a Path);

impl<'a> Mounted<'a> {
    fn tmpfs(dir: &'a Path, mib: usize) -> Self {
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("running mount");
        assert!(status.success(), "the full-disk test mounts a tmpfs and needs root (mount -t tmpfs) to do it");
        Self(dir)
    }

    /// Fill the file system until `room` bytes are left (rounded to its blocks).
    fn leave(&self, room: u64) {
        let output = Command::new("stat").args(["-f", "-c", "%a %S"]).arg(self.0).output().expect("stat -f");
        let text = String::from_utf8_lossy(&output.stdout);
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().expect("a number"));
        let (available, block) = (fields.next().expect("blocks"), fields.next().expect("block size"));
        let keep = room.div_ceil(block) * block;
        let filler = (available * block).saturating_sub(keep);
        std::fs::write(self.0.join("filler"), vec![0u8; filler as usize]).expect("filling the disk");
    }

    fn free(&self) {
        std::fs::remove_file(self.0.join("filler")).expect("the filler");
    }
}

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0).status();
    }
}

#[tokio::test]
async fn an_upload_that_cannot_be_saved_fails_and_a_restart_agrees() {
    let tenants = tenants();
    let root = tempfile::tempdir().expect("tmp");
    let data = root.path().join("data");
    std::fs::create_dir(&data).expect("data directory");
    let disk = Mounted::tmpfs(&data, 16);
    let server = Server::start_in_dir(tenants.path(), &data, root.path(), &[]).expect("starts");
    let component = std::fs::read(guest("hostile_guest")).expect("component");
    let weights = std::fs::read(digits_small_model()).expect("weights");

    // Room for the upload itself and nothing more: its state cannot be saved.
    disk.leave(component.len() as u64);
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/digits/versions/2", KEY, component.clone()).await;
    assert_eq!(code, 500, "{body}");
    assert_eq!(versions(&server).await, ["1"], "a version that was not saved does not serve");
    disk.free();
    disk.leave(weights.len() as u64);
    let (code, body) = server.send(Method::PUT, "/control/v1/models/small", KEY, weights.clone()).await;
    assert_eq!(code, 500, "{body}");
    assert_eq!(server.get("/v2/models/small", Some(KEY)).await.0, 404, "a model that was not saved does not serve");
    assert_eq!(files_in(&data.join("registry/tmp")), 0, "no temp file is left");

    drop(server);
    disk.free();
    let server = Server::start_in_dir(tenants.path(), &data, root.path(), &[]).expect("restarts");
    assert_eq!(versions(&server).await, ["1"], "the restart agrees with the answer");
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/digits/versions/2", KEY, component).await;
    assert_eq!(code, 201, "a retry is a new upload, not a conflict: {body}");
    let (code, body) = server.send(Method::PUT, "/control/v1/models/small", KEY, weights).await;
    assert_eq!(code, 201, "{body}");
    drop(server);
    let server = Server::start_in_dir(tenants.path(), &data, root.path(), &[]).expect("restarts again");
    assert_eq!(versions(&server).await, ["1", "2"]);
    assert_eq!(server.get("/v2/models/small", Some(KEY)).await.0, 200);
}

const OTHER: &str = "test-key-globex";

#[tokio::test]
async fn deleting_frees_names_memory_and_disk_but_never_what_serves() {
    let tenants = tenants();
    tenants.write("globex.toml", &tenant_header("globex", OTHER, ""));
    let data = tempfile::tempdir().expect("tmp");
    let mut server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    let resident = |server: &Server| {
        let server = server.metrics.clone().expect("metrics");
        async move {
            let text = reqwest::get(format!("{server}/metrics")).await.expect("scrape").text().await.expect("text");
            let line = text.lines().find(|l| l.starts_with("sluice_resident_models ")).expect("the gauge").to_string();
            line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).expect("a number")
        }
    };
    let row = serde_json::json!({
        "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }],
    });
    let small = std::fs::read(digits_small_model()).expect("weights");
    let blob = data.path().join("registry/blobs/sha256").join(sha256_file(&digits_small_model()));
    assert_eq!(server.send(Method::PUT, "/control/v1/models/extra", KEY, small.clone()).await.0, 201);
    assert_eq!(server.send(Method::PUT, "/control/v1/models/same", OTHER, small.clone()).await.0, 201);
    let component = std::fs::read(guest("digits")).expect("component");
    assert_eq!(server.send(Method::PUT, "/control/v1/apps/digits/versions/2", KEY, component).await.0, 201);
    let canary = serde_json::json!({ "stable": "1", "canary": { "version": "2", "weight": 10 } });
    let put = server.send(Method::PUT, "/control/v1/apps/digits/traffic", KEY, canary.to_string().into()).await;
    assert_eq!(put.0, 200, "{}", put.1);
    assert_eq!(resident(&server).await, 3.0, "digits-mlp, and each tenant's copy of the weights both uploaded");

    // What serves, what the manifest declares and what is not the caller's are refused.
    for (path, key, status, message) in [
        ("/control/v1/apps/digits/versions/2", KEY, 409, "is its canary; change the traffic first"),
        ("/control/v1/apps/digits/versions/1", KEY, 409, "declared in the tenant's manifest"),
        ("/control/v1/models/digits-mlp", KEY, 409, "declared in the tenant's manifest"),
        ("/control/v1/models/same", KEY, 404, "not found"),
        ("/control/v1/models/extra", OTHER, 404, "not found"),
        ("/control/v1/apps/digits/versions/2", OTHER, 404, "not found"),
    ] {
        let (code, body) = server.send(Method::DELETE, path, key, Vec::new()).await;
        assert_eq!(code, status, "{path}: {body}");
        assert!(error_message(&body).contains(message), "{path}: {body}");
    }
    assert_eq!(server.infer("extra", KEY, &row).await.0, 200);
    assert_eq!(versions(&server).await, ["1", "2"]);

    // Out of traffic, version 2 goes; the model goes; the other tenant's copy of the same
    // weights keeps serving, and keeps the blob.
    let stable = serde_json::json!({ "stable": "1" });
    assert_eq!(
        server.send(Method::PUT, "/control/v1/apps/digits/traffic", KEY, stable.to_string().into()).await.0,
        200
    );
    let (code, body) = server.send(Method::DELETE, "/control/v1/apps/digits/versions/2", KEY, Vec::new()).await;
    assert_eq!((code, &body["deleted"]), (200, &serde_json::json!(true)), "{body}");
    assert_eq!(versions(&server).await, ["1"]);
    assert_eq!(server.post_raw("/v2/models/digits/versions/2/infer", Some(KEY), row.to_string().into()).await.0, 404);
    let (code, body) = server.send(Method::DELETE, "/control/v1/models/extra", KEY, Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(server.infer("extra", KEY, &row).await.0, 404);
    assert_eq!(server.infer("same", OTHER, &row).await.0, 200);
    assert!(blob.exists(), "the other tenant still references the weights");
    // The deleted copy's queue task ends (and drops the weights) just after the answer.
    let started = std::time::Instant::now();
    while resident(&server).await != 2.0 && started.elapsed() < std::time::Duration::from_secs(5) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(resident(&server).await, 2.0, "digits-mlp and the other tenant's copy");

    // The last reference gone: the blob and the resident copy go too.
    assert_eq!(server.send(Method::DELETE, "/control/v1/models/same", OTHER, Vec::new()).await.0, 200);
    assert!(!blob.exists(), "nothing references the weights");
    // The copy's queue task ends (and drops the weights) just after the answer.
    let started = std::time::Instant::now();
    while resident(&server).await != 1.0 && started.elapsed() < std::time::Duration::from_secs(5) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(resident(&server).await, 1.0, "only the manifest's model stays resident");

    // After a restart: gone, and the names are free again.
    assert!(server.terminate());
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("restarts");
    assert_eq!(versions(&server).await, ["1"]);
    assert_eq!(server.infer("extra", KEY, &row).await.0, 404);
    assert_eq!(server.send(Method::PUT, "/control/v1/models/extra", KEY, small).await.0, 201);
    assert_eq!(server.infer("extra", KEY, &row).await.0, 200);
}

/// Another tenant's uploads that take long to load (a graph of many small nodes: seconds of
/// the engine's CPU as it loads) hold nothing this tenant's upload waits for: each tenant's
/// uploads load one at a time among its own, beside other tenants'.
#[tokio::test]
async fn another_tenants_slow_uploads_never_hold_up_this_ones() {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let tenants = tenants();
    let quotas = "max_resident_model_mib = 8192\nmax_models = 64\nmax_model_bytes = 100000000";
    tenants.write("globex.toml", &tenant_header("globex", OTHER, quotas));
    let server = Arc::new(Server::start(tenants.path(), &[]));
    let upload = |key: &'static str, path: String, body: Vec<u8>| {
        let server = server.clone();
        async move {
            let started = Instant::now();
            let (code, body) = server.send(Method::PUT, &format!("/control/v1/{path}"), key, body).await;
            assert_eq!(code, 201, "{path}: {body}");
            started.elapsed()
        }
    };

    // Models: the other tenant's backlog loads on its own turn; this tenant's loads beside it.
    const NODES: usize = 20_000;
    let alone = upload(OTHER, "models/chain-0".into(), crate::onnx::add_chain(NODES)).await;
    assert!(alone > Duration::from_millis(400), "a chain of {NODES} nodes loaded in {alone:?}");
    // Two more at once, as many as a tenant may have in progress (each its own weights:
    // identical ones would share the first's copy).
    let hogs: Vec<_> = (1..3)
        .map(|i| tokio::spawn(upload(OTHER, format!("models/chain-{i}"), crate::onnx::add_chain(NODES + i))))
        .collect();
    tokio::time::sleep(alone / 4).await;
    let took = upload(KEY, "models/small".into(), crate::onnx::passes_through()).await;
    assert!(took < alone / 2, "a small model's upload took {took:?} behind the other tenant's ({alone:?} each)");
    for hog in hogs {
        hog.await.expect("an upload");
    }
}

/// An upload's body streams to a temp file in the data directory, and its bytes are read
/// into memory before it loads: a tenant's uploads in progress are few, so that bodies held
/// open cannot fill the disk or the memory every tenant shares.
#[tokio::test]
async fn a_tenant_has_at_most_two_uploads_in_progress() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let tenants = tenants();
    tenants.write("globex.toml", &tenant_header("globex", OTHER, "max_model_bytes = 8000000"));
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    // Eight uploads of 8 MB each, 4 MB sent and the rest held back.
    let mut held = Vec::new();
    for i in 0..8 {
        let mut connection = tokio::net::TcpStream::connect(server.http_address()).await.expect("connects");
        let head = format!(
            "PUT /control/v1/models/held-{i} HTTP/1.1\r\nhost: sluice\r\nauthorization: Bearer {OTHER}\r\n\
             content-length: 8000000\r\n\r\n"
        );
        connection.write_all(head.as_bytes()).await.expect("sent");
        // A refused upload is answered before its body is read: the write may then fail.
        let _ = connection.write_all(&vec![7u8; 4_000_000]).await;
        held.push(connection);
    }
    let mut refused = 0;
    for connection in &mut held {
        let mut answer = vec![0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(500), connection.read(&mut answer)).await {
            Ok(Ok(read)) if read > 0 => {
                let answer = String::from_utf8_lossy(&answer[..read]).to_string();
                assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
                assert!(answer.contains("2 uploads in progress"), "{answer}");
                refused += 1;
            }
            _ => {}
        }
    }
    assert_eq!(refused, 6, "two uploads go on, the others are refused at once");
    let temp: u64 = std::fs::read_dir(data.path().join("registry/tmp"))
        .expect("temp dir")
        .map(|entry| entry.expect("entry").metadata().expect("size").len())
        .sum();
    assert!(temp <= 8_000_000, "{temp} bytes of uploads in progress on the disk");
    // Another tenant's upload goes on meanwhile.
    let weights = std::fs::read(digits_small_model()).expect("weights");
    let (code, body) = server.send(Method::PUT, "/control/v1/models/mine", KEY, weights).await;
    assert_eq!(code, 201, "{body}");
    drop(held);
}

/// What an upload leaves beside its blob (a component's compiled form, a model's form
/// optimised by its engine) goes with the blob: a tenant uploading and deleting in a loop
/// grew the data directory every tenant shares without bound.
#[tokio::test]
async fn what_an_upload_leaves_on_disk_goes_when_it_is_deleted() {
    let tenants = tenants();
    let data = tempfile::tempdir().expect("tmp");
    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
    let bytes_in = |dir: &str| -> u64 {
        std::fs::read_dir(data.path().join(dir))
            .map(|entries| entries.map(|e| e.expect("entry").metadata().expect("size").len()).sum())
            .unwrap_or(0)
    };
    let before = (bytes_in("compiled"), bytes_in("optimized"));
    let component = std::fs::read(guest("digits")).expect("component");
    for round in 0..4 {
        let version = with_custom_section(&component, &round.to_string());
        let (code, body) = server.send(Method::PUT, "/control/v1/apps/digits/versions/9", KEY, version).await;
        assert_eq!(code, 201, "{body}");
        let (code, body) =
            server.send(Method::PUT, "/control/v1/models/m", KEY, crate::onnx::add_chain(2 + round)).await;
        assert_eq!(code, 201, "{body}");
        assert!(bytes_in("compiled") > before.0 && bytes_in("optimized") > before.1, "round {round} left them");
        let (code, body) = server.send(Method::DELETE, "/control/v1/apps/digits/versions/9", KEY, Vec::new()).await;
        assert_eq!(code, 200, "{body}");
        let (code, body) = server.send(Method::DELETE, "/control/v1/models/m", KEY, Vec::new()).await;
        assert_eq!(code, 200, "{body}");
    }
    assert_eq!((bytes_in("compiled"), bytes_in("optimized")), before, "nothing of the deleted uploads is left");
}

#[tokio::test]
async fn a_saved_model_the_server_now_refuses_stops_no_start_and_is_kept_until_deleted() {
    use sha2::Digest;
    let tenants = tenants();
    let data = tempfile::tempdir().expect("tmp");
    let weights = std::fs::read(digits_small_model()).expect("weights");
    {
        let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
        let (code, body) = server.send(Method::PUT, "/control/v1/models/small", KEY, weights.clone()).await;
        assert_eq!(code, 201, "{body}");
    }
    // Saved by an earlier build that took it: a model this one refuses (NonZero works outside
    // the engine's capped memory). The build before stopped at start on it, every tenant's
    // server with it: "restoring the saved control state".
    let refused = crate::onnx::nonzero_of_shape(4);
    let sha256 = hex::encode(sha2::Sha256::digest(&refused));
    let registry = data.path().join("registry");
    std::fs::write(registry.join("blobs/sha256").join(&sha256), &refused).expect("blob");
    let control = registry.join("control/acme.json");
    let mut saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&control).expect("saved")).expect("json");
    saved["models"]["nonzero"] = serde_json::json!(sha256);
    std::fs::write(&control, saved.to_string()).expect("saved");

    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts with the refused model saved");
    let request = serde_json::json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }] });
    assert_eq!(server.infer("small", KEY, &request).await.0, 200, "the tenant's other upload serves");
    assert_eq!(server.infer("digits-mlp", KEY, &request).await.0, 200, "and its manifest's model");
    let (code, index) = server.post_raw("/v2/repository/index", Some(KEY), Vec::new()).await;
    assert_eq!(code, 200, "{index}");
    let entry = index.as_array().expect("index").iter().find(|e| e["name"] == "nonzero").cloned().expect("listed");
    assert_eq!(entry["state"], "UNAVAILABLE", "{entry}");
    assert!(entry["reason"].as_str().is_some_and(|r| r.contains("(NonZero)")), "{entry}");
    assert_eq!(server.get("/v2/models/nonzero", Some(KEY)).await.0, 404, "it does not serve");
    // Kept through the tenant's other changes, and its name taken until it is deleted.
    let (code, body) = server.send(Method::PUT, "/control/v1/models/other", KEY, weights.clone()).await;
    assert_eq!(code, 201, "{body}");
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&control).expect("saved")).expect("json");
    assert_eq!(saved["models"]["nonzero"], serde_json::json!(sha256), "{saved}");
    let (code, body) = server.send(Method::PUT, "/control/v1/models/nonzero", KEY, weights.clone()).await;
    assert_eq!(code, 409, "{body}");
    let blob = registry.join("blobs/sha256").join(&sha256);
    assert!(blob.exists(), "its blob is kept");
    let (code, body) = server.send(Method::DELETE, "/control/v1/models/nonzero", KEY, Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    assert!(!blob.exists(), "deleted, its blob goes");
    let (_, index) = server.post_raw("/v2/repository/index", Some(KEY), Vec::new()).await;
    assert!(!index.to_string().contains("nonzero"), "{index}");
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&control).expect("saved")).expect("json");
    assert!(saved["models"].get("nonzero").is_none(), "{saved}");
}

/// A saved app version this server can no longer prepare (its operator lowered guest memory
/// below what the component asks for at its start) stops no start: the build before stopped
/// at "restoring the saved control state", every tenant's server with it. It is listed as
/// unavailable with its reason, answered 503, and kept (its blob, its saved state, its
/// version's name) until its tenant deletes it.
#[tokio::test]
async fn a_saved_component_the_server_can_no_longer_prepare_stops_no_start_and_is_kept_until_deleted() {
    const OTHER: &str = "test-key-other";
    const SMALL: &str = "test-key-small";
    let data = tempfile::tempdir().expect("tmp");
    let echo = std::fs::read(guest("echo_guest")).expect("component");
    let big = with_memory_of(&echo, 40);
    let tenants_with = |memory_mib: u64| {
        let tenants = Tenants::new();
        let quotas = format!("guest_memory_mib = {memory_mib}\nmax_component_bytes = 100000000");
        let manifest = tenant_header("acme", KEY, &quotas) + &app_entry("digits", &guest("digits"));
        tenants.write("acme.toml", &manifest);
        tenants
            .write("other.toml", &(tenant_header("other", OTHER, &quotas) + &app_entry("echo", &guest("echo_guest"))));
        tenants.write("small.toml", &tenant_header("small", SMALL, "guest_memory_mib = 16"));
        tenants
    };
    let x = serde_json::json!({ "inputs": [{ "name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0] }] });
    let roomy = tenants_with(64);
    {
        let server = Server::start_in(roomy.path(), data.path(), &[]).expect("starts");
        let (code, body) = server.send(Method::PUT, "/control/v1/apps/big/versions/1", KEY, big.clone()).await;
        assert_eq!(code, 201, "{body}");
        assert_eq!(server.infer("big", KEY, &x).await.0, 200, "it serves in 64 MiB");
        // A tenant given less memory than it asks for at its start is refused it, saying why
        // (the build before took it, 201, then failed every request it got, 500).
        let (code, body) = server.send(Method::PUT, "/control/v1/apps/big/versions/1", SMALL, big.clone()).await;
        assert_eq!(code, 400, "{body}");
        assert!(error_message(&body).contains("needs 40 MiB of memory at its start"), "{body}");
    }

    let tight = tenants_with(16);
    let server = Server::start_in(tight.path(), data.path(), &[]).expect("starts with the component saved");
    assert_eq!(server.infer("echo", OTHER, &x).await.0, 200, "the other tenant serves");
    let (code, body) = server.infer("big", KEY, &x).await;
    assert_eq!(code, 503, "{body}");
    let message = error_message(&body);
    assert!(message.contains("could not be prepared") && message.contains("big/1.wasm"), "{body}");
    let data_dir = data.path().to_str().expect("utf-8");
    assert!(!message.contains(data_dir) && !message.contains("blobs"), "no server path: {body}");
    let (code, index) = server.post_raw("/v2/repository/index", Some(KEY), Vec::new()).await;
    assert_eq!(code, 200, "{index}");
    let entry = index.as_array().expect("index").iter().find(|e| e["name"] == "big").cloned().expect("listed");
    assert_eq!(entry["state"], "UNAVAILABLE", "{entry}");
    assert!(entry["reason"].as_str().is_some_and(|r| r.contains("memory")), "{entry}");
    let (code, ready) = server.get("/v2/models/big/ready", Some(KEY)).await;
    assert_eq!((code, &ready["ready"]), (400, &serde_json::json!(false)), "{ready}");
    let mut grpc = crate::grpc::client(&server).await;
    let ready = sluice::api::grpc::proto::ModelReadyRequest { name: "big".into(), version: String::new() };
    assert!(!grpc.model_ready(authed(ready, KEY)).await.expect("answered").into_inner().ready);
    let (code, status) = server.get("/control/v1/apps/big", Some(KEY)).await;
    assert_eq!(code, 200, "{status}");
    assert!(status["unavailable"]["1"].as_str().is_some_and(|r| r.contains("memory")), "{status}");

    // Kept through the tenant's other changes; its name taken until it is deleted.
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/big/versions/1", KEY, echo.clone()).await;
    assert_eq!(code, 409, "{body}");
    let (code, body) = server.send(Method::PUT, "/control/v1/apps/big/versions/2", KEY, echo.clone()).await;
    assert_eq!(code, 201, "{body}");
    let control = data.path().join("registry/control/acme.json");
    let saved =
        || -> serde_json::Value { serde_json::from_slice(&std::fs::read(&control).expect("saved")).expect("json") };
    let big_sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&big));
    assert_eq!(saved()["apps"]["big"]["versions"]["1"], serde_json::json!(big_sha256), "{}", saved());
    let blob = data.path().join("registry/blobs/sha256").join(&big_sha256);
    assert!(blob.exists(), "its blob is kept");
    let (code, body) = server.send(Method::DELETE, "/control/v1/apps/big/versions/1", KEY, Vec::new()).await;
    assert_eq!(code, 409, "the stable version: {body}");
    let stable = serde_json::json!({ "stable": "2" }).to_string().into_bytes();
    assert_eq!(server.send(Method::PUT, "/control/v1/apps/big/traffic", KEY, stable).await.0, 200);
    assert_eq!(server.infer("big", KEY, &x).await.0, 200, "its new stable version serves");
    let (code, body) = server.send(Method::DELETE, "/control/v1/apps/big/versions/1", KEY, Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    assert!(!blob.exists(), "deleted, its blob goes");
    assert!(saved()["apps"]["big"]["versions"].get("1").is_none(), "{}", saved());
    let (_, status) = server.get("/control/v1/apps/big", Some(KEY)).await;
    assert!(status.get("unavailable").is_none(), "{status}");
}

/// A saved upload whose blob is gone from the data directory (lost to a disk fault, or removed
/// by hand) stops no start either: the build before stopped every tenant's server at "restoring
/// the saved control state". The model and the app version are listed as unavailable, and kept
/// until their tenant deletes them.
#[tokio::test]
async fn a_saved_upload_whose_bytes_are_gone_stops_no_start() {
    use sha2::Digest;
    let tenants = tenants();
    let data = tempfile::tempdir().expect("tmp");
    let weights = std::fs::read(digits_small_model()).expect("weights");
    let component = std::fs::read(guest("echo_guest")).expect("component");
    {
        let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts");
        let (code, body) = server.send(Method::PUT, "/control/v1/models/small", KEY, weights.clone()).await;
        assert_eq!(code, 201, "{body}");
        let (code, body) = server.send(Method::PUT, "/control/v1/apps/echo/versions/1", KEY, component.clone()).await;
        assert_eq!(code, 201, "{body}");
    }
    let blobs = data.path().join("registry/blobs/sha256");
    for bytes in [&weights, &component] {
        std::fs::remove_file(blobs.join(hex::encode(sha2::Sha256::digest(bytes)))).expect("the blob was stored");
    }

    let server = Server::start_in(tenants.path(), data.path(), &[]).expect("starts with its blobs gone");
    let request = serde_json::json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }] });
    assert_eq!(server.infer("digits-mlp", KEY, &request).await.0, 200, "the manifest's model serves");
    let (code, index) = server.post_raw("/v2/repository/index", Some(KEY), Vec::new()).await;
    assert_eq!(code, 200, "{index}");
    for name in ["small", "echo"] {
        let entry = index.as_array().expect("index").iter().find(|e| e["name"] == name).cloned().expect("listed");
        assert_eq!(entry["state"], "UNAVAILABLE", "{entry}");
        let reason = entry["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("reading a stored blob failed") && !reason.contains("/"), "{entry}");
    }
    let (code, body) = server.send(Method::DELETE, "/control/v1/models/small", KEY, Vec::new()).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = server.send(Method::PUT, "/control/v1/models/small", KEY, weights).await;
    assert_eq!(code, 201, "uploaded again: {body}");
    assert_eq!(server.infer("small", KEY, &request).await.0, 200);
}
