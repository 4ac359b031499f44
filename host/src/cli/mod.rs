//! `sluice` control commands (kubectl-like) over the control API: push a model or an app
//! version, set traffic, promote, roll back, and read status and events; and the platform
//! admin's commands ([`admin`]) for tenants, keys and quotas. Text for people by
//! default, `--output json` for scripts; errors say what to do next.

pub mod admin;
mod client;
mod render;

use std::path::PathBuf;

use anyhow::Context;
use serde_json::{Value, json};

pub use admin::AdminCommand;
pub use client::ControlClient;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Where and as whom the commands act.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// The server's HTTP address.
    #[arg(long, env = "SLUICE_SERVER", default_value = "http://127.0.0.1:8000")]
    pub server: String,
    /// The tenant's API key.
    #[arg(long, env = "SLUICE_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// `text` for people, `json` for scripts.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// The control commands.
#[derive(Debug, clap::Subcommand)]
pub enum ControlCommand {
    /// Upload a component as a new version of an app (the app is created if new).
    #[command(subcommand)]
    App(AppCommand),
    /// Upload ONNX weights as a new model of the tenant (components load it by name).
    #[command(subcommand)]
    Model(ModelCommand),
    /// Set an app's traffic split.
    #[command(subcommand)]
    Traffic(TrafficCommand),
    /// Make an app's canary its stable version.
    Promote {
        app: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Send all of an app's traffic back to its stable version.
    Rollback {
        app: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// An app's versions, traffic, per-version outcomes and shadow comparison.
    Status {
        app: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// The canary analysis' decisions for an app, with the numbers behind them; with
    /// `--model`, the autoscaler's for one of the tenant's models.
    Events {
        app: String,
        /// NAME is a model: show its autoscaler's decisions.
        #[arg(long)]
        model: bool,
        #[command(flatten)]
        connection: Connection,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum AppCommand {
    /// `sluice app push APP VERSION COMPONENT.wasm [--models NAME:VERSION,...]`
    Push {
        app: String,
        version: String,
        component: PathBuf,
        /// Model versions its `load-by-name` calls get, as `NAME:VERSION,...` (others: the
        /// newest).
        #[arg(long)]
        models: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
    /// `sluice app delete APP VERSION` (an uploaded version not in traffic)
    Delete {
        app: String,
        version: String,
        #[command(flatten)]
        connection: Connection,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum ModelCommand {
    /// `sluice model push NAME MODEL.onnx [--version N]`
    Push {
        name: String,
        weights: PathBuf,
        /// Upload the weights as this version of the model (a new name without it).
        #[arg(long)]
        version: Option<u64>,
        #[command(flatten)]
        connection: Connection,
    },
    /// `sluice model delete NAME [--version N]` (one of the tenant's uploaded models, or one
    /// version of it)
    Delete {
        name: String,
        #[arg(long)]
        version: Option<u64>,
        #[command(flatten)]
        connection: Connection,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum TrafficCommand {
    /// `sluice traffic set APP --stable 1 [--canary 2:10] [--shadow 3:0.05] [--sticky-header H]`
    Set {
        app: String,
        /// The version serving unpinned requests.
        #[arg(long)]
        stable: String,
        /// `VERSION:PERCENT` of unpinned requests for a canary.
        #[arg(long)]
        canary: Option<String>,
        /// `VERSION:FRACTION` of unpinned requests mirrored to a shadow.
        #[arg(long)]
        shadow: Option<String>,
        /// A request header whose value keeps a caller on one side of the split.
        #[arg(long)]
        sticky_header: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
}

impl ControlCommand {
    fn connection(&self) -> &Connection {
        match self {
            Self::App(AppCommand::Push { connection, .. } | AppCommand::Delete { connection, .. })
            | Self::Model(ModelCommand::Push { connection, .. } | ModelCommand::Delete { connection, .. })
            | Self::Traffic(TrafficCommand::Set { connection, .. })
            | Self::Promote { connection, .. }
            | Self::Rollback { connection, .. }
            | Self::Status { connection, .. }
            | Self::Events { connection, .. } => connection,
        }
    }
}

/// Run one control command and print its result.
pub async fn run(command: ControlCommand) -> anyhow::Result<()> {
    let output = command.connection().output;
    let client = ControlClient::new(command.connection())?;
    let (app, answer) = match command {
        ControlCommand::App(AppCommand::Push { app, version, component, models, .. }) => {
            let bytes = std::fs::read(&component).with_context(|| {
                format!("cannot read {}: pass the path of a built .wasm component", component.display())
            })?;
            let query = models.map(|models| format!("?models={models}")).unwrap_or_default();
            let path = format!("/control/v1/apps/{app}/versions/{version}{query}");
            let answer = client.upload(&path, bytes, output).await?;
            if output == Output::Text {
                println!("app {app}: version {version} added (sha256 {})", answer["sha256"].as_str().unwrap_or("?"));
                return Ok(());
            }
            (app, answer)
        }
        ControlCommand::Model(ModelCommand::Push { name, weights, version, .. }) => {
            let bytes = std::fs::read(&weights)
                .with_context(|| format!("cannot read {}: pass the path of an ONNX model", weights.display()))?;
            let answer = client.upload(&model_path(&name, version), bytes, output).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&answer)?),
                Output::Text => println!(
                    "model {name}: version {} added (sha256 {})",
                    answer["version"].as_str().unwrap_or("?"),
                    answer["sha256"].as_str().unwrap_or("?")
                ),
            }
            return Ok(());
        }
        ControlCommand::App(AppCommand::Delete { app, version, .. }) => {
            let answer = client.send("DELETE", &format!("/control/v1/apps/{app}/versions/{version}"), None).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&answer)?),
                Output::Text => println!("app {app}: version {version} deleted"),
            }
            return Ok(());
        }
        ControlCommand::Model(ModelCommand::Delete { name, version, .. }) => {
            let answer = client.send("DELETE", &model_path(&name, version), None).await?;
            match (output, version) {
                (Output::Json, _) => println!("{}", serde_json::to_string_pretty(&answer)?),
                (Output::Text, None) => println!("model {name} deleted"),
                (Output::Text, Some(version)) => println!("model {name}: version {version} deleted"),
            }
            return Ok(());
        }
        ControlCommand::Traffic(TrafficCommand::Set { app, stable, canary, shadow, sticky_header, .. }) => {
            let body = json!({
                "stable": stable,
                "canary": canary.as_deref().map(|c| split("--canary", c, "weight")).transpose()?,
                "shadow": shadow.as_deref().map(|s| split("--shadow", s, "sample")).transpose()?,
                "sticky_header": sticky_header,
            });
            let answer = client.send("PUT", &format!("/control/v1/apps/{app}/traffic"), Some(body)).await?;
            (app, answer)
        }
        ControlCommand::Promote { app, .. } => {
            (app.clone(), client.send("POST", &format!("/control/v1/apps/{app}/promote"), None).await?)
        }
        ControlCommand::Rollback { app, .. } => {
            (app.clone(), client.send("POST", &format!("/control/v1/apps/{app}/rollback"), None).await?)
        }
        ControlCommand::Status { app, .. } => {
            (app.clone(), client.send("GET", &format!("/control/v1/apps/{app}"), None).await?)
        }
        ControlCommand::Events { app, model, .. } => {
            let path = if model { format!("/control/v1/models/{app}") } else { format!("/control/v1/apps/{app}") };
            let status = client.send("GET", &path, None).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&status["events"])?),
                Output::Text if model => print!("{}", render::scale_events(&status)),
                Output::Text => print!("{}", render::events(&status)),
            }
            return Ok(());
        }
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&answer)?),
        Output::Text => print!("{}", render::status(&app, &answer)),
    }
    Ok(())
}

/// A model's control path, or one version's.
fn model_path(name: &str, version: Option<u64>) -> String {
    match version {
        None => format!("/control/v1/models/{name}"),
        Some(version) => format!("/control/v1/models/{name}/versions/{version}"),
    }
}

/// `VERSION:NUMBER` as `{"version": …, field: number}`.
fn split(flag: &str, value: &str, field: &str) -> anyhow::Result<Value> {
    let (version, number) = value
        .split_once(':')
        .with_context(|| format!("{flag} '{value}': expected VERSION:{}", field.to_uppercase()))?;
    let number: f64 = number.parse().with_context(|| format!("{flag} '{value}': '{number}' is not a number"))?;
    Ok(json!({ "version": version, field: number }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_version_and_number() {
        assert_eq!(split("--canary", "2:10", "weight").expect("valid"), json!({ "version": "2", "weight": 10.0 }));
        let error = split("--canary", "2", "weight").expect_err("no number");
        assert!(error.to_string().contains("expected VERSION:WEIGHT"), "{error}");
        assert!(split("--shadow", "3:lots", "sample").is_err());
    }
}
