//! The shipped Grafana dashboard and Prometheus rules reference only metrics that `/metrics`
//! exports, and the SLO alert rules are the ones `sluice slo-rules` generates.

use std::collections::BTreeSet;
use std::process::Command;

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
