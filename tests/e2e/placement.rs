//! Where execution instances run: `[[models.X.instances]]` groups (Triton's instance groups),
//! CPU instances pinned to cores, and what a model whose device is missing does
//! (`on_missing_device`): on this machine there is no CUDA GPU, so every `gpu` group is one.

use serde_json::{Value, json};

use crate::support::*;

const KEY: &str = "acme-placement-key";

/// The held-out digits as the plain MLP takes them (`X`, FP32 [rows, 64]).
fn digits_rows(rows: usize) -> Value {
    let pixels: Vec<f32> =
        heldout_digits().into_iter().take(rows).flat_map(|(pixels, _)| pixels.into_iter().map(f32::from)).collect();
    json!({ "inputs": [{ "name": "X", "shape": [rows, 64], "datatype": "FP32", "data": pixels }] })
}

/// The digits MLP with the given TOML lines after its entry (instance groups, policies).
fn tenant_with_digits(lines: &str) -> Tenants {
    let tenants = Tenants::new();
    let manifest =
        tenant_header("acme", KEY, "") + &model_entry("digits", &digits_model(), Some("onnxruntime")) + lines;
    tenants.write("acme.toml", &manifest);
    tenants
}

/// The server's threads named `name`: (thread id, allowed cores, nanoseconds run).
fn threads_named(pid: u32, name: &str) -> Vec<(String, String, u64)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's threads");
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| {
            let path = task.path();
            let comm = std::fs::read_to_string(path.join("comm")).ok()?;
            if comm.trim() != name {
                return None;
            }
            let status = std::fs::read_to_string(path.join("status")).ok()?;
            let allowed = status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:"))?.trim().to_string();
            let ran = std::fs::read_to_string(path.join("schedstat")).ok()?.split_whitespace().next()?.parse().ok()?;
            Some((task.file_name().to_string_lossy().into_owned(), allowed, ran))
        })
        .collect()
}

/// The last core this test process may run on (the server inherits the same).
fn last_core() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("own status");
    let allowed = status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:")).expect("allowed cpus");
    let last = allowed.trim().rsplit([',', '-']).next().expect("a core");
    last.parse().expect("a core number")
}

#[tokio::test]
async fn a_pinned_instance_computes_on_its_cores_only() {
    let core = last_core();
    let tenants =
        tenant_with_digits(&format!("[[models.digits.instances]]\nkind = \"cpu\"\ncount = 2\ncpus = \"{core}\"\n"));
    let server = Server::start(tenants.path(), &[]);
    for _ in 0..20 {
        let (code, body) = server.infer("digits", KEY, &digits_rows(8)).await;
        assert_eq!(code, 200, "{body}");
    }
    let name = format!("sluice-cpu{core}");
    let threads = threads_named(server.pid(), &name);
    // One run thread per instance; an engine's pool threads, made during the load, carry the
    // name and the pinning too.
    assert!(threads.len() >= 2, "no pinned threads named {name}: {threads:?}");
    for (tid, allowed, _) in &threads {
        assert_eq!(allowed, &core.to_string(), "thread {tid} may run beyond core {core}");
    }
    assert!(threads.iter().any(|(_, _, ran)| *ran > 0), "the pinned threads never ran: {threads:?}");
    let (code, config) = server.get("/v2/models/digits/config", Some(KEY)).await;
    assert_eq!(code, 200, "{config}");
    assert_eq!(config["instance_group"], json!([{ "name": "digits_cpu", "kind": "KIND_CPU", "count": 2 }]));

    // A core this process may not use refuses the start, naming it.
    let tenants = tenant_with_digits("[[models.digits.instances]]\nkind = \"cpu\"\ncpus = \"4000\"\n");
    let data = tempfile::tempdir().expect("data");
    let log = Server::start_in(tenants.path(), data.path(), &[]).err().expect("the start is refused");
    assert!(log.contains("cpus 4000 names cores this process may not run on"), "{log}");
}

#[tokio::test]
async fn a_gpu_model_without_its_gpu_runs_on_the_cpu_or_is_refused() {
    // The default policy: the instances run on the CPU, the log and the model's config say so.
    let tenants = tenant_with_digits("[[models.digits.instances]]\nkind = \"gpu\"\ncount = 2\ndevices = [7]\n");
    let server = Server::start(tenants.path(), &[]);
    let (code, body) = server.infer("digits", KEY, &digits_rows(4)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        i64s(&output(&body, "label")["data"]),
        heldout_digits().iter().take(4).map(|(_, l)| *l).collect::<Vec<_>>()
    );
    let (_, config) = server.get("/v2/models/digits/config", Some(KEY)).await;
    assert_eq!(config["instance_group"], json!([{ "name": "digits_cpu", "kind": "KIND_CPU", "count": 2 }]));
    let (code, status) = server.get("/control/v1/models/digits", Some(KEY)).await;
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["placements"], json!(["cpu", "cpu"]));
    let fallback = status["placement_fallback"].as_str().expect("why it is not on its GPU");
    assert!(
        fallback.starts_with("cuda:7 is missing: ") && fallback.ends_with("(on_missing_device = \"cpu\")"),
        "{fallback}"
    );
    assert!(server.log().contains("model placed on the cpu instead"), "the fallback is logged");

    // `refuse`: the model does not load, and the start fails naming the device.
    let tenants = tenant_with_digits(
        "on_missing_device = \"refuse\"\n[[models.digits.instances]]\nkind = \"gpu\"\ndevices = [7]\n",
    );
    let data = tempfile::tempdir().expect("data");
    let log = Server::start_in(tenants.path(), data.path(), &[]).err().expect("the start is refused");
    assert!(log.contains("model 'digits' cannot be placed: it asks for device cuda:7, which is missing here"), "{log}");
    assert!(log.contains("(on_missing_device = \"refuse\")"), "{log}");
}

#[test]
fn instance_groups_are_checked_when_the_manifest_loads() {
    let cases = [
        (
            "[[models.digits.instances]]\nkind = \"cpu\"\ndevices = [0]\n",
            "a cpu instance group takes cpus, not devices",
        ),
        ("[[models.digits.instances]]\nkind = \"gpu\"\ncpus = \"0\"\n", "cpus pins cpu instance groups only"),
        ("[[models.digits.instances]]\nkind = \"cpu\"\ncount = 0\n", "an instance group needs count >= 1"),
        ("[[models.digits.instances]]\nkind = \"cpu\"\ncpus = \"3-1\"\n", "invalid cpus '3-1'"),
        ("[[models.digits.instances]]\nkind = \"tpu\"\n", "unknown variant `tpu`"),
        (
            "[models.digits.batching]\ninstances = 2\n[[models.digits.instances]]\nkind = \"cpu\"\n",
            "declare instances either as batching.instances or as [[instances]] groups",
        ),
    ];
    for (lines, expected) in cases {
        let tenants = tenant_with_digits(lines);
        let data = tempfile::tempdir().expect("data");
        let log = Server::start_in(tenants.path(), data.path(), &[]).err().expect("the start is refused");
        assert!(log.contains(expected), "{lines}: expected {expected:?} in\n{log}");
    }
}

#[tokio::test]
async fn webgpu_instances_answer_as_the_cpu_does() {
    let (flags, env) = software_webgpu();
    let tenants = Tenants::new();
    let mut manifest = tenant_header("acme", KEY, "");
    manifest += &model_entry("digits-cpu", &digits_model(), Some("onnxruntime"));
    manifest += &model_entry("digits-webgpu", &digits_model(), Some("onnxruntime"));
    manifest += "on_missing_device = \"refuse\"\n[[models.digits-webgpu.instances]]\nkind = \"webgpu\"\n";
    tenants.write("acme.toml", &manifest);
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend(["--admin-token", "root-token"]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server = Server::start_with_env(tenants.path(), &args, &env);

    let rows = digits_rows(32);
    let (code, on_cpu) = server.infer("digits-cpu", KEY, &rows).await;
    assert_eq!(code, 200, "{on_cpu}");
    let (code, on_webgpu) = server.infer("digits-webgpu", KEY, &rows).await;
    assert_eq!(code, 200, "{on_webgpu}");
    assert_eq!(output(&on_webgpu, "label")["data"], output(&on_cpu, "label")["data"]);
    let (cpu, webgpu) =
        (f32s(&output(&on_cpu, "probabilities")["data"]), f32s(&output(&on_webgpu, "probabilities")["data"]));
    let worst = cpu.iter().zip(&webgpu).map(|(c, w)| (c - w).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "probabilities differ by up to {worst}");

    let (_, config) = server.get("/v2/models/digits-webgpu/config", Some(KEY)).await;
    assert_eq!(config["instance_group"], json!([{ "name": "digits-webgpu_webgpu", "kind": "KIND_GPU", "count": 1 }]));
    let (code, devices) = server.send(reqwest::Method::GET, "/admin/v1/devices", "root-token", Vec::new()).await;
    assert_eq!(code, 200, "{devices}");
    assert_eq!(devices["webgpu"]["available"], true, "{devices}");
    // wgpu's own enumeration sees the same software adapter through Vulkan.
    let adapters = devices["portable"].as_array().expect("portable adapters");
    assert!(
        adapters
            .iter()
            .any(|a| a["name"].as_str().is_some_and(|n| n.contains("SwiftShader")) && a["device_type"] == "cpu"),
        "{devices}"
    );
    let budgets: Vec<&str> =
        devices["model_memory"].as_array().expect("budgets").iter().filter_map(|d| d["device"].as_str()).collect();
    assert!(budgets.contains(&"webgpu"), "{devices}");
    let on_device = "sluice_tenant_compute_seconds_total{device=\"webgpu\",model=\"digits-webgpu\",tenant=\"acme\"}";
    assert!(server.metric(on_device).await > 0.0, "the batch's compute is billed to the webgpu device");
}
