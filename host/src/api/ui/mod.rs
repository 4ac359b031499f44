//! The status page on the HTTP port. `GET /ui` is a static page (with its script and style)
//! that asks for a key and then shows the panel, fetched again every five seconds without a
//! reload; `GET /ui/panel` is the panel, rendered by the server: per tenant its quotas, apps
//! (versions, traffic, canary state and the analysis' events, objectives and budgets), models
//! (state, instances, memory, its own rows waiting, drift per feature) and the last hour of
//! its traffic as SVG charts (throughput, p50/p99 latency, error rate). The admin token sees
//! every tenant; a tenant's key its own, and every figure counts that tenant's use only.

mod chart;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use maud::{Markup, PreEscaped, html};

use super::auth::authenticate;
use super::error::ApiError;
use super::triton::state_and_reason;
use crate::rollout::status::{RolloutStatus, status};
use crate::state::{ServingState, TenantState};
use crate::telemetry::activity::MinutePoint;
use crate::telemetry::drift::{DriftReport, FeatureDrift};
use crate::telemetry::slo::minute_now;
use chart::{BLUE_LINE, Line, ORANGE_LINE, RED_LINE};

type Shared = Arc<ServingState>;

const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("page.js");
const STYLE: &str = include_str!("page.css");

/// Scripts only from this server (no inline script runs, even in a tenant-named value), styles
/// too, and no framing by other sites.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// Canary events shown per app, the latest.
const EVENTS_SHOWN: usize = 5;
/// Drift features shown per model, the worst.
const FEATURES_SHOWN: usize = 8;

pub fn routes() -> axum::Router<Shared> {
    axum::Router::new()
        .route("/ui", get(|| async { served(PAGE, HTML) }))
        .route("/ui/page.js", get(|| async { served(SCRIPT, "text/javascript; charset=utf-8") }))
        .route("/ui/page.css", get(|| async { served(STYLE, "text/css; charset=utf-8") }))
        .route("/ui/panel", get(panel))
}

const HTML: &str = "text/html; charset=utf-8";

/// `body` with its type and the page's security headers.
fn served(body: impl IntoResponse, content_type: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ];
    (headers, body).into_response()
}

/// `GET /ui/panel`: the panel for the admin token (every tenant) or a tenant's key (its own).
async fn panel(State(state): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    let tenants = if super::admin::is_admin(&state, &headers) {
        state.all_tenants()
    } else {
        vec![authenticate(&state, &headers)?]
    };
    let markup = html! {
        @for tenant in &tenants {
            (tenant_section(tenant))
        }
    };
    Ok(([(header::CACHE_CONTROL, "no-store")], served(markup.into_string(), HTML)).into_response())
}

fn tenant_section(tenant: &TenantState) -> Markup {
    let spec = tenant.spec();
    let id = spec.id.as_str();
    let quotas: Vec<(String, String)> = match serde_json::to_value(&spec.quotas) {
        Ok(serde_json::Value::Object(fields)) => fields
            .into_iter()
            .map(|(name, value)| match value {
                serde_json::Value::String(text) => (name, text),
                value => (name, value.to_string()),
            })
            .collect(),
        _ => Vec::new(),
    };
    let apps = tenant.apps();
    html! {
        section.tenant id={ "tenant-" (id) } data-tenant=(id) {
            h2 { "Tenant " (id) }
            h3 { "Quotas" }
            dl.quotas {
                @for (name, value) in &quotas {
                    dt { (name) } dd { (value) }
                }
            }
            h3 { "Apps" }
            @if apps.is_empty() {
                p.none { "No apps." }
            }
            @for (_, app) in &apps {
                (app_section(&status(app)))
            }
            h3 { "Models" }
            (models_table(tenant, id))
            h3 { "Traffic, last hour" }
            (traffic(tenant))
        }
    }
}

fn app_section(app: &RolloutStatus) -> Markup {
    let events: Vec<_> = app.events.iter().rev().take(EVENTS_SHOWN).collect();
    html! {
        div.app data-app=(app.name) {
            table {
                tr {
                    th { "App" } td { (app.name) }
                    th { "World" } td { (app.world.unwrap_or("")) }
                    th { "Stable" } td { (app.stable) }
                    th { "Canary" }
                    td {
                        @if let Some(canary) = &app.canary {
                            (canary.version) " at " (format!("{:.0}%", canary.weight * 100.0))
                        } @else { "none" }
                    }
                    th { "Shadow" }
                    td {
                        @if let Some(shadow) = &app.shadow {
                            (shadow.version) " sampling " (format!("{:.0}%", shadow.sample * 100.0))
                        } @else { "none" }
                    }
                }
            }
            table.versions {
                tr { th { "Version" } th { "Requests" } th { "Errors" } th { "p99" } }
                @for (version, figures) in &app.versions {
                    tr {
                        td { (version) }
                        td { (figures.requests) }
                        td { (figures.errors) }
                        td { @if let Some(ms) = figures.p99_ms { (format!("{ms:.1} ms")) } }
                    }
                }
            }
            @if !events.is_empty() {
                table.events {
                    tr { th { "Canary analysis" } th { "Version" } th { "Weight" } th { "Why" } }
                    @for event in events {
                        tr {
                            td { (event.action) }
                            td { (event.canary_version) }
                            td { (format!("{:.0}% → {:.0}%", event.weight_before * 100.0, event.weight_after * 100.0)) }
                            td { (event.reason) }
                        }
                    }
                }
            }
            @if let Some(objectives) = &app.slo {
                table.slo {
                    tr { th { "Objective" } th { "Target" } th { "Requests" } th { "Budget left" } th { "Burn 1h" } th { "Alerts" } }
                    @for objective in objectives {
                        tr {
                            td { (objective.sli.label()) }
                            td { (format!("{}% over {} d", objective.target * 100.0, objective.window_days)) }
                            td { (objective.requests) }
                            td { (format!("{:.1}%", objective.budget_remaining * 100.0)) }
                            td { (format!("{:.2}", objective.burn_rates.get("1h").copied().unwrap_or(0.0))) }
                            td {
                                @for alert in objective.alerts.iter().filter(|alert| alert.firing) {
                                    span.firing { (alert.condition.severity) " " (alert.condition.long) "/" (alert.condition.short) " " }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn models_table(tenant: &TenantState, id: &str) -> Markup {
    let states = tenant.models.states();
    if states.is_empty() {
        return html! { p.none { "No models." } };
    }
    html! {
        table.models {
            tr {
                th { "Model" } th { "Version" } th { "State" } th { "Backend" } th { "Instances" } th { "Memory" }
                th { "Rows waiting" } th { "Placement" } th { "Drift" }
            }
            @for (name, version, model_state) in states {
                @if let Some((_, copy)) = tenant.models.own_version(name.as_str(), version) {
                    @let (state, reason) = state_and_reason(model_state);
                    @let drift = copy.drift.get(id).and_then(|monitor| monitor.latest());
                    tr data-model=(name.as_str()) data-version=(version.to_string()) {
                        td { (name.as_str()) }
                        td { (version.to_string()) }
                        td title=(reason) { (state) }
                        td { (copy.backend.to_string()) }
                        td { (copy.queue.instances()) }
                        td { (format!("{:.1} MiB", copy.footprint() as f64 / f64::from(1 << 20))) }
                        td { (copy.queue.waiting_rows(id)) }
                        td { (copy.placed.placements.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")) }
                        td {
                            @match &drift {
                                Some(report) if !report.features.is_empty() => {
                                    span class={ "level-" (report.level) } { (report.level) }
                                    @for feature in worst_features(report) {
                                        " " (feature.feature) " " (format!("PSI {:.3}", feature.psi))
                                    }
                                }
                                Some(report) => { (report.status) }
                                None => { "not sampled" }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The features that drifted most, the worst first.
fn worst_features(report: &DriftReport) -> Vec<&FeatureDrift> {
    let mut features: Vec<&FeatureDrift> = report.features.iter().collect();
    features.sort_by(|a, b| b.psi.total_cmp(&a.psi));
    features.truncate(FEATURES_SHOWN);
    features
}

/// Three charts per app or model that saw traffic in the last hour.
fn traffic(tenant: &TenantState) -> Markup {
    let now = minute_now();
    let targets: Vec<_> = tenant.activity.last_hour().into_iter().filter(|(_, points)| !points.is_empty()).collect();
    if targets.is_empty() {
        return html! { p.none { "No requests in the last hour." } };
    }
    html! {
        @for (name, points) in &targets {
            h3 { (name) }
            div.charts data-target=(name) {
                (figure("Throughput, requests a second", points, &[Line {
                    name: "requests/s",
                    colour: BLUE_LINE,
                    points: series(points, now, |point| Some(f64::from(point.requests) / 60.0)),
                }], "req/s"))
                (figure("Latency, ms", points, &[
                    Line { name: "p50", colour: BLUE_LINE, points: series(points, now, |point| point.p50_ms) },
                    Line { name: "p99", colour: ORANGE_LINE, points: series(points, now, |point| point.p99_ms) },
                ], "ms"))
                (figure("Server errors, %", points, &[Line {
                    name: "errors",
                    colour: RED_LINE,
                    points: series(points, now, |point| Some(100.0 * f64::from(point.errors) / f64::from(point.requests.max(1)))),
                }], "%"))
            }
        }
    }
}

fn figure(caption: &str, points: &[MinutePoint], lines: &[Line<'_>], unit: &str) -> Markup {
    html! {
        figure.chart data-points=(points.len()) {
            @match chart::svg(lines, unit) {
                // Plotters' markup: numbers and this module's own labels, nothing a tenant wrote.
                Some(svg) => (PreEscaped(svg)),
                None => p.none { "(the chart could not be drawn)" },
            }
            figcaption { (caption) }
        }
    }
}

/// (minutes before `now`, value) of each minute that has a value.
fn series(points: &[MinutePoint], now: u32, value: impl Fn(&MinutePoint) -> Option<f64>) -> Vec<(i32, f64)> {
    points
        .iter()
        .filter_map(|point| Some((-i32::try_from(now.saturating_sub(point.minute)).ok()?, value(point)?)))
        .collect()
}
