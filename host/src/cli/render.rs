//! Text renderings of the control API's answers.

use std::fmt::Write;

use serde_json::Value;

fn number(value: &Value) -> String {
    value.as_f64().map_or_else(|| "-".to_string(), |n| format!("{n}"))
}

/// An app's rollout status as a few aligned lines.
pub fn status(app: &str, status: &Value) -> String {
    let mut text = format!("app {app}\n  stable   {}\n", status["stable"].as_str().unwrap_or("-"));
    if let Some(canary) = status["canary"].as_object() {
        let _ = writeln!(
            text,
            "  canary   {} at {}%",
            canary["version"].as_str().unwrap_or("?"),
            number(&canary["weight"])
        );
    }
    if let Some(shadow) = status["shadow"].as_object() {
        let _ = writeln!(
            text,
            "  shadow   {} sampling {}",
            shadow["version"].as_str().unwrap_or("?"),
            number(&shadow["sample"])
        );
    }
    if let Some(header) = status["sticky_header"].as_str() {
        let _ = writeln!(text, "  sticky   {header}");
    }
    text += "  VERSION  REQUESTS  ERRORS  P99 (ms)  MODELS\n";
    for (version, figures) in status["versions"].as_object().into_iter().flatten() {
        // The model versions it pins, as `NAME:VERSION` (a weights-only canary differs here).
        let pins = figures["models"].as_object().into_iter().flatten();
        let pins: Vec<String> =
            pins.map(|(model, pinned)| format!("{model}:{}", pinned.as_str().unwrap_or("?"))).collect();
        let _ = writeln!(
            text,
            "  {version:<8} {:>8}  {:>6}  {:>8}  {}",
            figures["requests"],
            figures["errors"],
            number(&figures["p99_ms"]),
            if pins.is_empty() { "-".to_string() } else { pins.join(",") }
        );
    }
    // Saved versions this server could not prepare, each with why.
    for (version, reason) in status["unavailable"].as_object().into_iter().flatten() {
        let _ = writeln!(text, "  {version:<8} unavailable: {}", reason.as_str().unwrap_or("?"));
    }
    let shadow = &status["shadow_comparison"];
    if shadow["mirrored"].as_u64().unwrap_or(0) > 0 {
        let _ = writeln!(
            text,
            "  shadow: {} mirrored, {} dropped, {} failed, label agreement {}, max |diff| {}",
            shadow["mirrored"],
            shadow["dropped"],
            shadow["failed"],
            number(&shadow["label_agreement"]),
            number(&shadow["max_abs_diff"])
        );
    }
    text
}

/// The analysis' decisions, one per line, waits folded into a count.
/// A model's autoscaler decisions, one a line.
pub fn scale_events(status: &Value) -> String {
    let mut text = String::new();
    for event in status["events"].as_array().into_iter().flatten() {
        let _ = writeln!(
            text,
            "{:<15} {} -> {} instances: {}",
            event["action"].as_str().unwrap_or("?"),
            event["instances_before"],
            event["instances_after"],
            event["reason"].as_str().unwrap_or(""),
        );
    }
    if text.is_empty() {
        text = format!("no decisions yet ({} instances)\n", status["instances"]);
    }
    text
}

pub fn events(status: &Value) -> String {
    let mut text = String::new();
    let mut waits = 0;
    for event in status["events"].as_array().into_iter().flatten() {
        if event["action"] == "wait" {
            waits += 1;
            continue;
        }
        let _ = writeln!(
            text,
            "{:<9} {} {}% -> {}%: {} (canary {} requests, {} errors; stable {} requests, {} errors)",
            event["action"].as_str().unwrap_or("?"),
            event["canary_version"].as_str().unwrap_or("?"),
            number(&event["weight_before"]),
            number(&event["weight_after"]),
            event["reason"].as_str().unwrap_or(""),
            event["canary"]["requests"],
            event["canary"]["errors"],
            event["stable"]["requests"],
            event["stable"]["errors"],
        );
    }
    if waits > 0 {
        let _ = writeln!(text, "({waits} windows waited for data)");
    }
    if text.is_empty() {
        text = "no decisions yet\n".to_string();
    }
    text
}

/// Tenants, one line each.
/// The server's devices, one a line, and why there is no GPU where there is none.
pub fn devices(devices: &Value) -> String {
    let mib = |value: &Value| value.as_u64().map_or("?".to_string(), |bytes| (bytes >> 20).to_string());
    let cpu = &devices["cpu"];
    let mut text = format!(
        "cpu      {} cores, {} MiB; models {} of {} MiB budget\n",
        cpu["cores"],
        mib(&cpu["memory_bytes"]),
        mib(&cpu["model_memory_used_bytes"]),
        mib(&cpu["model_memory_budget_bytes"]),
    );
    for gpu in devices["cuda"].as_array().into_iter().flatten() {
        let _ = writeln!(
            text,
            "cuda:{}   {} (compute {}, {}), {} MiB, {} MiB free",
            gpu["index"],
            gpu["name"].as_str().unwrap_or("?"),
            gpu["compute_capability"].as_str().unwrap_or("?"),
            gpu["uuid"].as_str().unwrap_or("?"),
            mib(&gpu["memory_total_bytes"]),
            mib(&gpu["memory_free_bytes"]),
        );
    }
    if let Some(why) = devices["cuda_absent"].as_str() {
        let _ = writeln!(text, "no CUDA device: {why}");
    }
    for adapter in devices["portable"].as_array().into_iter().flatten() {
        let _ = writeln!(
            text,
            "portable {} ({}, {}, driver {})",
            adapter["name"].as_str().unwrap_or("?"),
            adapter["backend"].as_str().unwrap_or("?"),
            adapter["device_type"].as_str().unwrap_or("?"),
            adapter["driver"].as_str().unwrap_or("?"),
        );
    }
    match devices["webgpu"]["reason"].as_str() {
        Some(why) => {
            let _ = writeln!(text, "no WebGPU adapter: {why}");
        }
        None if devices["webgpu"]["available"] == true => text.push_str("webgpu   an adapter through ONNX Runtime\n"),
        None => {}
    }
    // Every other device's model memory (the cpu's is on its line).
    for budget in devices["model_memory"].as_array().into_iter().flatten().filter(|b| b["device"] != "cpu") {
        let _ = writeln!(
            text,
            "{:<8} models {} of {} MiB budget",
            budget["device"].as_str().unwrap_or("?"),
            mib(&budget["used_bytes"]),
            mib(&budget["budget_bytes"]),
        );
    }
    text
}

pub fn tenants(tenants: &Value) -> String {
    let mut text = "TENANT           KEYS  CONCURRENT  WEIGHT  MEMORY (MiB)\n".to_string();
    for tenant in tenants.as_array().into_iter().flatten() {
        let quotas = &tenant["quotas"];
        let _ = writeln!(
            text,
            "{:<16} {:>4}  {:>10}  {:>6}  {:>12}",
            tenant["id"].as_str().unwrap_or("?"),
            tenant["keys"].as_array().map_or(0, Vec::len),
            quotas["max_concurrent_requests"],
            quotas["compute_weight"],
            quotas["guest_memory_mib"]
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn status_shows_the_model_versions_each_version_pins_and_the_unavailable_ones() {
        let status = json!({
            "stable": "1",
            "versions": {
                "1": { "requests": 3, "errors": 0, "p99_ms": null },
                "2": { "requests": 1, "errors": 0, "p99_ms": 1.5, "models": { "digits-mlp": "2" } },
            },
            "unavailable": { "3": "component digits/3.wasm is not usable: memory" },
            "shadow_comparison": { "mirrored": 0 },
        });
        let text = super::status("digits", &status);
        assert!(text.contains("  3        unavailable: component digits/3.wasm is not usable: memory\n"), "{text}");
        let row = |version: &str| text.lines().find(|line| line.trim_start().starts_with(&format!("{version} ")));
        assert!(row("2").is_some_and(|line| line.ends_with("  digits-mlp:2")), "{text}");
        assert!(row("1").is_some_and(|line| line.ends_with("  -")), "{text}");
    }
}
