//! The shipped Grafana dashboard and Prometheus rules against a real Prometheus (Debian's
//! package) scraping a real server: every panel's query returns series, every rule evaluates
//! and the alerts the traffic should raise are raised; `promtool` checks the rules and runs
//! their unit tests; they reference only metrics `/metrics` exports, and the SLO alert rules
//! are the ones `sluice slo-rules` generates. The GPU check's scripts pass shellcheck. The
//! Kubernetes manifests pass `kubernetes-validate --strict`, hold together (names, keys, ports,
//! targets), and the tenants their ConfigMaps carry serve from the image's layout.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice::telemetry::metrics::names;

use crate::slo::{KEY, burning_app, half_failing_traffic, scrape_until};
use crate::support::*;

/// Every `sluice_*` metric name in a text, histogram series under their family name.
fn referenced(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (start, _) in text.match_indices("sluice_") {
        let name: String =
            text[start..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        let family = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
        found.insert(family.to_string());
    }
    found
}

/// A Prometheus server scraping one Sluice metrics port every second, with the shipped rules.
struct Prometheus {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(metrics: &str, rules: &Path) -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("port").port();
        let rule_files: Vec<String> = ["sluice-alerts.yml", "sluice-slo-alerts.yml"]
            .iter()
            .map(|file| format!("\"{}\"", rules.join(file).display()))
            .collect();
        let config = format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nrule_files: [{}]\nscrape_configs:\n  - \
             job_name: sluice\n    static_configs: [{{ targets: [\"{}\"] }}]\n",
            rule_files.join(", "),
            metrics.trim_start_matches("http://")
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("config");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new(prometheus_program("prometheus"))
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starts prometheus");
        let prometheus = Self { child, base: format!("http://127.0.0.1:{port}"), _dir: dir };
        let started = Instant::now();
        while reqwest::get(format!("{}/-/ready", prometheus.base)).await.map_or(true, |r| r.status() != 200) {
            let log = std::fs::read_to_string(prometheus._dir.path().join("prometheus.log")).unwrap_or_default();
            assert!(started.elapsed() < Duration::from_secs(30), "prometheus did not become ready:\n{log}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        prometheus
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let url = reqwest::Url::parse_with_params(&format!("{}/api/v1/{path}", self.base), query).expect("url");
        let body: Value = reqwest::get(url).await.expect("prometheus answers").json().await.expect("json");
        assert_eq!(body["status"], "success", "{path} {query:?}: {body}");
        body["data"].clone()
    }

    /// The series an instant query returns.
    async fn query(&self, expr: &str) -> Vec<Value> {
        self.api("query", &[("query", expr)]).await["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every panel query of the dashboard, with Grafana's variables filled in (the tenant chosen: a pattern that matches
/// anything would also match a label the series lacks).
fn panel_queries(dashboard: &Value) -> Vec<(String, String)> {
    let panels = dashboard["panels"].as_array().expect("panels");
    panels
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or("?").to_string();
            panel["targets"].as_array().cloned().unwrap_or_default().into_iter().map(move |target| {
                let expr = target["expr"].as_str().expect("a PromQL target");
                (title.clone(), expr.replace("$__rate_interval", "30s").replace("$tenant", "acme"))
            })
        })
        .collect()
}

#[tokio::test]
async fn every_panel_and_rule_works_on_a_real_prometheus_scraping_the_server() {
    let (_tenants, server) = burning_app();
    let root = repo_root().join("deploy");
    let prometheus = Prometheus::start(server.metrics.as_deref().expect("metrics"), &root.join("prometheus")).await;
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana/sluice-dashboard.json")).expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let queries = panel_queries(&dashboard);
    assert!(queries.len() >= 15, "{queries:?}");

    // Traffic over several scrapes, so rates have two samples to compare.
    let plain = json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }] });
    let started = Instant::now();
    let mut empty = queries.clone();
    let mut active = BTreeSet::new();
    let expected_alerts = BTreeSet::from(["SluiceErrorBudgetFastBurn", "SluiceGuestTraps", "SluiceServerErrors"]);
    while !(empty.is_empty() && expected_alerts.iter().all(|a| active.contains(*a))) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "panels whose query returns nothing: {empty:#?}\nalerts active: {active:?}"
        );
        half_failing_traffic(&server).await;
        for _ in 0..4 {
            assert_eq!(server.infer("digits-mlp", KEY, &plain).await.0, 200);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut still_empty = Vec::new();
        for (title, expr) in empty {
            if prometheus.query(&expr).await.is_empty() {
                still_empty.push((title, expr));
            }
        }
        empty = still_empty;
        let alerts = prometheus.api("alerts", &[]).await;
        active = alerts["alerts"]
            .as_array()
            .expect("alerts")
            .iter()
            .filter_map(|a| a["labels"]["alertname"].as_str().map(str::to_string))
            .collect();
    }
    // Every rule evaluates without error.
    let rules = prometheus.api("rules", &[]).await;
    let rules: Vec<&Value> = rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
        .collect();
    assert_eq!(rules.len(), 7, "every shipped rule is loaded");
    for rule in rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    let promtool = prometheus_program("promtool");
    let rules = repo_root().join("deploy/prometheus");
    for args in [
        vec!["check", "rules", "sluice-alerts.yml", "sluice-slo-alerts.yml"],
        vec!["test", "rules", "sluice-alerts.test.yml"],
    ] {
        let output = Command::new(&promtool).args(&args).current_dir(&rules).output().expect("runs promtool");
        assert!(
            output.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The GPU check runs where nothing can be fixed on the spot: its scripts pass shellcheck
/// (Debian's, unpacked) and its Python parses.
#[test]
fn the_gpu_check_scripts_pass_shellcheck() {
    let shellcheck = debian_package("shellcheck").join("usr/bin/shellcheck");
    let scripts = ["scripts/gpu-pack.sh", "scripts/gpu-check.sh"];
    let output = Command::new(&shellcheck).args(scripts).current_dir(repo_root()).output().expect("runs shellcheck");
    assert!(output.status.success(), "shellcheck:\n{}", String::from_utf8_lossy(&output.stdout));
    for script in ["scripts/gpu_check.py", "scripts/gpu_settings.py", "scripts/gpu_share.py"] {
        let compiled = Command::new("python3")
            .args(["-c", &format!("import ast; ast.parse(open('{script}').read())")])
            .current_dir(repo_root())
            .status()
            .expect("runs python3");
        assert!(compiled.success(), "{script} does not parse");
    }
}

#[tokio::test]
async fn dashboard_and_rules_reference_only_exported_metrics() {
    let (_tenants, server) = burning_app();
    half_failing_traffic(&server).await;
    let plain = json!({ "inputs": [{ "name": "X", "shape": [1, 64], "datatype": "FP32", "data": vec![0.5f32; 64] }] });
    for _ in 0..2 {
        assert_eq!(server.infer("digits-mlp", KEY, &plain).await.0, 200);
    }
    let scrape = scrape_until(&server, |s| {
        let families = s.families();
        [names::SLO_BURN_RATE, names::SHADOW_COMPARISONS, names::DRIFT_PSI, names::DRIFT_KS]
            .iter()
            .all(|name| families.contains(*name))
    })
    .await;
    let exported = scrape.families();

    let root = repo_root().join("deploy");
    let dashboard = std::fs::read_to_string(root.join("grafana/sluice-dashboard.json")).expect("the dashboard");
    let parsed: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    assert!(parsed["panels"].as_array().is_some_and(|p| p.len() >= 10), "panels");
    let mut files = vec![("dashboard", dashboard)];
    for rules in ["sluice-alerts.yml", "sluice-slo-alerts.yml"] {
        files.push((rules, std::fs::read_to_string(root.join("prometheus").join(rules)).expect("rules")));
    }
    for autoscaling in ["hpa.yaml", "optional/prometheus-adapter.yaml", "optional/keda-scaledobject.yaml"] {
        files.push((autoscaling, std::fs::read_to_string(root.join("kubernetes").join(autoscaling)).expect("k8s")));
    }
    for (file, text) in &files {
        let names = referenced(text);
        assert!(!names.is_empty(), "{file} references no metric");
        let missing: Vec<&String> = names.iter().filter(|name| !exported.contains(*name)).collect();
        assert!(missing.is_empty(), "{file} references metrics /metrics does not export: {missing:?}\n{exported:?}");
    }
    for needed in
        [names::REQUEST_DURATION, names::BATCH_ROWS, names::QUEUE_WAIT, names::SLO_BUDGET_REMAINING, names::DRIFT_PSI]
    {
        assert!(files[0].1.contains(needed), "the dashboard shows {needed}");
    }

    let generated = Command::new(env!("CARGO_BIN_EXE_sluice")).arg("slo-rules").output().expect("runs sluice");
    assert!(generated.status.success());
    assert_eq!(
        String::from_utf8_lossy(&generated.stdout),
        files[2].1,
        "deploy/prometheus/sluice-slo-alerts.yml is `sluice slo-rules` output; regenerate it"
    );
}

/// The Kubernetes resource files the schema validator knows (not kustomizations, not CRDs).
fn kubernetes_resources(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("deploy/kubernetes") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                let text = std::fs::read_to_string(&path).expect("yaml");
                let crd = text.contains("apiVersion: keda.sh/") || text.contains("apiVersion: monitoring.coreos.com/");
                if !crd && !text.contains("kind: Kustomization") {
                    files.push(path);
                }
            }
        }
    }
    files.sort();
    files
}

/// Lay the tenants of a ConfigMap out as the image and the Deployment do: the manifests in
/// `tenants/`, the example models in `models/`, the components in `components/`.
fn image_layout(configmap_tenants: &Path) -> tempfile::TempDir {
    let image = tempfile::tempdir().expect("tmp");
    for dir in ["tenants", "models", "components"] {
        std::fs::create_dir(image.path().join(dir)).expect("dir");
    }
    for entry in std::fs::read_dir(configmap_tenants).expect("tenants") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, image.path().join("tenants").join(path.file_name().expect("name"))).expect("copy");
    }
    std::os::unix::fs::symlink(digits_model(), image.path().join("models/digits.onnx")).expect("link");
    std::os::unix::fs::symlink(guest("digits"), image.path().join("components/digits.wasm")).expect("link");
    image
}

#[tokio::test]
async fn the_kubernetes_manifests_validate_and_their_tenants_serve() {
    const ADMIN: &str = "test-admin-token-kubernetes";
    let python = python_with(&["kubernetes-validate==1.37.0"]);
    let root = repo_root().join("deploy/kubernetes");
    let resources = kubernetes_resources(&root);
    assert!(resources.len() >= 8, "{resources:?}");
    let validated = Command::new(&python)
        .args(["-m", "kubernetes_validate", "--strict", "--kubernetes-version", "1.37.0"])
        .args(&resources)
        .output()
        .expect("runs kubernetes-validate");
    let report = String::from_utf8_lossy(&validated.stdout).to_string() + &String::from_utf8_lossy(&validated.stderr);
    assert!(validated.status.success(), "{report}");
    assert_eq!(report.matches(" passed ").count(), resources.len(), "every file passes:\n{report}");

    let configmaps = tempfile::tempdir().expect("tmp");
    let checked = Command::new(&python)
        .arg(repo_root().join("tests/clients/kubernetes_check.py"))
        .arg(&root)
        .arg(configmaps.path())
        .output()
        .expect("runs the check");
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));

    // The CPU variant's tenants serve, and a key the admin issues calls the example app.
    let image = image_layout(&configmaps.path().join("sluice-tenants"));
    let server = Server::start(&image.path().join("tenants"), &["--admin-token", ADMIN]);
    let (code, issued) = server.send(reqwest::Method::POST, "/admin/v1/tenants/example/keys", ADMIN, Vec::new()).await;
    assert_eq!(code, 201, "{issued}");
    let key = issued["key"].as_str().expect("a key");
    let (pixels, label) = &heldout_digits()[0];
    let (code, answer) = server.infer("digits", key, &image_request(pixels, &[1, 64])).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(i64s(&output(&answer, "label")["data"]), vec![*label]);

    // The GPU variant's tenants refuse to serve from a machine without the GPU they ask for.
    if !Path::new("/dev/nvidia0").exists() {
        let image = image_layout(&configmaps.path().join("sluice-tenants-gpu"));
        let data = tempfile::tempdir().expect("tmp");
        let refused = Server::start_in(&image.path().join("tenants"), data.path(), &[]).err().expect("refuses");
        assert!(refused.contains("cuda:0") && refused.contains("on_missing_device = \"refuse\""), "{refused}");
    }
}
