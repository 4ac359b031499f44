//! The status page in a real browser (Debian's Chromium, headless): the demo tenants with the
//! admin token, one tenant alone with its key, charts with points after traffic; a screenshot
//! is kept at `target/ui/status-page.png`.

use std::path::PathBuf;
use std::process::Command;

use reqwest::Method;

use crate::support::*;

const ADMIN: &str = "test-admin-token-ui";

/// Debian's chromium: the one on the PATH, or installed (apt-get) when the machine has none.
/// `None` (and a loud message) only where it cannot be installed.
fn chromium() -> Option<PathBuf> {
    let found =
        || ["/usr/bin/chromium", "/usr/bin/chromium-browser"].into_iter().map(PathBuf::from).find(|path| path.exists());
    if let Some(path) = found() {
        return Some(path);
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "chromium"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
    };
    if !install().is_ok_and(|s| s.success()) {
        // Package lists may be missing on a fresh machine.
        let _ = Command::new("apt-get").arg("update").status();
        let _ = install();
    }
    let path = found();
    if path.is_none() {
        eprintln!(
            "\n*** SKIPPED: the status page test needs Debian's chromium, and `apt-get install chromium` failed ***\n"
        );
    }
    path
}

/// Chromium headless on `url`, with `arguments` (--dump-dom, --screenshot=...), after the
/// page's script has had 10 s of virtual time; its standard output.
fn browse(chromium: &PathBuf, url: &str, arguments: &[&str]) -> String {
    let profile = tempfile::tempdir().expect("a profile directory");
    let output = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(arguments)
        .arg(url)
        .output()
        .expect("chromium runs");
    assert!(output.status.success(), "chromium failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The markup between `<section ... data-tenant="TENANT"` and the next section.
fn tenant_section<'a>(dom: &'a str, tenant: &str) -> &'a str {
    let start = dom.find(&format!("data-tenant=\"{tenant}\"")).unwrap_or_else(|| panic!("no tenant {tenant}: {dom}"));
    let rest = &dom[start..];
    &rest[..rest.find("</section>").unwrap_or(rest.len())]
}

#[tokio::test]
async fn the_status_page_shows_the_demo_tenants_and_charts_their_traffic_in_chromium() {
    let Some(chromium) = chromium() else { return };
    let server = Server::start(&repo_root().join("tenants"), &["--admin-token", ADMIN]);
    let (pixels, _) = &heldout_digits()[0];
    for _ in 0..20 {
        let (status, body) = server.infer("digits", "acme-demo-key", &image_request(pixels, &[1, 64])).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = server.infer("digits", "globex-demo-key", &image_request(pixels, &[1, 64])).await;
    assert_eq!(status, 200, "{body}");

    // The panel itself: a key is needed, and a tenant's key shows that tenant alone.
    let (status, _) = server.send(Method::GET, "/ui/panel", "not-a-key", Vec::new()).await;
    assert_eq!(status, 401);
    let base = format!("http://{}", server.http_address());
    let panel = |key: &str| {
        let client = reqwest::Client::new();
        let request = client.get(format!("{base}/ui/panel")).bearer_auth(key.to_string()).send();
        async move { request.await.expect("the panel answers").text().await.expect("its markup") }
    };
    let globex_view = panel("globex-demo-key").await;
    assert!(globex_view.contains("data-tenant=\"globex\""), "{globex_view}");
    assert!(!globex_view.contains("data-tenant=\"acme\""), "a tenant sees no other tenant: {globex_view}");

    // The page in the browser, with the admin token: every demo tenant, with charts.
    let url = format!("{base}/ui#key={ADMIN}");
    let dom = browse(&chromium, &url, &["--dump-dom"]);
    let acme = tenant_section(&dom, "acme");
    assert!(tenant_section(&dom, "globex").contains("Tenant globex"), "{dom}");
    for shown in ["Tenant acme", "max_concurrent_requests", "data-app=\"digits\"", "data-model=\"digits-mlp\"", "READY"]
    {
        assert!(acme.contains(shown), "the acme panel lacks {shown}: {acme}");
    }
    let charts = &acme[acme.find("data-target=\"digits\"").expect("acme's digits traffic is charted")..];
    assert!(charts.contains("data-points=\"1\"") || charts.contains("data-points=\"2\""), "{charts}");
    assert!(charts.contains("<svg") && charts.contains("<circle"), "a chart with points: {charts}");

    // With a tenant's key the browser shows that tenant alone.
    let dom = browse(&chromium, &format!("{base}/ui#key=globex-demo-key"), &["--dump-dom"]);
    assert!(dom.contains("data-tenant=\"globex\"") && !dom.contains("data-tenant=\"acme\""), "{dom}");

    let folder = repo_root().join("target/ui");
    std::fs::create_dir_all(&folder).expect("target/ui");
    let screenshot = folder.join("status-page.png");
    let _ = std::fs::remove_file(&screenshot);
    browse(&chromium, &url, &[&format!("--screenshot={}", screenshot.display()), "--window-size=1400,2200"]);
    let size = std::fs::metadata(&screenshot).map_or(0, |m| m.len());
    assert!(size > 10_000, "a screenshot of the page ({size} bytes) at {}", screenshot.display());
}

/// Markup a hostile tenant puts in what it controls: here its model's tensor names, which the
/// page shows as drift features.
const MARKUP: &str = "x<img src=q onerror=alert(1)>";

#[tokio::test]
async fn a_tenants_own_names_reach_the_page_as_text_never_as_markup() {
    use crate::onnx::{FLOAT, GraphProto, model, node, value};
    let folder = tempfile::tempdir().expect("tmp");
    let path = folder.path().join("mirror.onnx");
    let output = format!("{MARKUP}-out");
    std::fs::write(
        &path,
        model(GraphProto {
            node: vec![node("Identity", &[MARKUP], &[&output], Vec::new())],
            name: "mirror".into(),
            initializer: Vec::new(),
            input: vec![value(MARKUP, FLOAT, &[None, Some(2)])],
            output: vec![value(&output, FLOAT, &[None, Some(2)])],
            ..Default::default()
        }),
    )
    .expect("the model");
    let tenants = Tenants::new();
    let drift = "[models.mirror.drift]\nsample_rate = 1.0\nmax_samples_per_second = 100000\nreference_rows = 8\nwindow_rows = 8\n\n";
    tenants.write("acme.toml", &(tenant_header("acme", "acme-key", "") + &model_entry("mirror", &path, None) + drift));
    let server = Server::start(tenants.path(), &[]);
    let request =
        serde_json::json!({ "inputs": [{ "name": MARKUP, "shape": [1, 2], "datatype": "FP32", "data": [0.5, 1.5] }] });
    let started = std::time::Instant::now();
    let panel = loop {
        let (status, body) = server.infer("mirror", "acme-key", &request).await;
        assert_eq!(status, 200, "{body}");
        let (_, drift) = server.get("/v2/models/mirror/drift", Some("acme-key")).await;
        if drift["features"].as_array().is_some_and(|features| !features.is_empty()) {
            let client = reqwest::Client::new();
            let answer = client
                .get(format!("http://{}/ui/panel", server.http_address()))
                .bearer_auth("acme-key")
                .send()
                .await
                .expect("the panel answers");
            break answer.text().await.expect("its markup");
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "no drift features: {drift}");
    };
    assert!(panel.contains("data-model=\"mirror\""), "{panel}");
    assert!(panel.contains("x&lt;img src=q onerror=alert(1)&gt;"), "the name shows, as text: {panel}");
    assert!(!panel.contains("<img"), "no tenant-written markup in the page: {panel}");
}
