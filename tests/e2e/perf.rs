//! `sluice perf` against a running server: per-tenant rows, an alternating tenant that sends
//! only in its on periods, and the other tenant reported for the periods without and beside it.

use std::process::Command;

use crate::support::*;

fn perf(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice")).arg("perf").args(args).output().expect("runs sluice perf");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The table row whose tenant cell is `tenant`, as its cells.
fn row(report: &str, tenant: &str) -> Vec<String> {
    report
        .lines()
        .map(|line| line.split('|').map(|cell| cell.trim().to_string()).filter(|c| !c.is_empty()).collect::<Vec<_>>())
        .find(|cells| cells.first().map(String::as_str) == Some(tenant))
        .unwrap_or_else(|| panic!("no row for {tenant} in\n{report}"))
}

#[tokio::test]
async fn an_alternating_tenant_splits_the_others_report_into_periods_without_and_beside_it() {
    let tenants = Tenants::new();
    for id in ["a", "b"] {
        let mut manifest = tenant_header(id, &format!("key-{id}"), "max_concurrent_requests = 64");
        manifest += &model_entry("digits-mlp", &digits_model(), None);
        tenants.write(&format!("{id}.toml"), &manifest);
    }
    let server = Server::start(tenants.path(), &[]);
    let address = server.base.trim_start_matches("http://");
    // 1 s measured in 0.25 s periods: off, on, off, on. A paced at 200/s sends 100 requests.
    let report = perf(&[
        "--address",
        address,
        "--model",
        "digits-mlp",
        "--tenant",
        "a:key-a:200",
        "--tenant",
        "b:key-b:c2",
        "--alternate",
        "a",
        "--alternate-period-s",
        "0.25",
        "--warmup-s",
        "0.3",
        "--duration-s",
        "1",
    ]);
    let a = row(&report, "a");
    let sent: u64 = a[1].parse().expect("a count");
    assert!((98..=102).contains(&sent), "a sends only in its on periods: {report}");
    assert_eq!(a[2], "0", "{report}");
    let throughput: f64 = a[3].parse().expect("a throughput");
    assert!((190.0..=210.0).contains(&throughput), "a's rate over its on time: {report}");
    for tenant in ["b (a off)", "b (a on)"] {
        let b = row(&report, tenant);
        assert!(b[1].parse::<u64>().expect("b count") > 10 && b[2] == "0", "{report}");
        assert!(b[6].ends_with(" ms"), "{report}");
    }

    // Over gRPC, a single tenant at a fixed concurrency.
    let report = perf(&[
        "--address",
        &server.grpc,
        "--grpc",
        "--model",
        "digits-mlp",
        "--key",
        "key-b",
        "--concurrency",
        "2",
        "--warmup-s",
        "0.2",
        "--duration-s",
        "0.5",
    ]);
    let single = row(&report, "-");
    assert!(single[1].parse::<u64>().expect("count") > 10 && single[2] == "0", "{report}");

    let refused = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["perf", "--address", address, "--model", "digits-mlp", "--tenant", "b:key-b:10", "--alternate", "c"])
        .output()
        .expect("runs sluice perf");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && message.contains("--alternate names no --tenant: c"), "{message}");
}
