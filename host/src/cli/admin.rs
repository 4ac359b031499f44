//! `sluice tenants`, `sluice keys`, `sluice quotas` and `sluice devices`: the platform
//! admin's commands over the admin API, with the admin token.

use anyhow::Context;
use serde_json::{Map, Value, json};

use super::client::ControlClient;
use super::{Output, render};

/// Where and as the admin the commands act.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminConnection {
    /// The server's HTTP address.
    #[arg(long, env = "SLUICE_SERVER", default_value = "http://127.0.0.1:8000")]
    pub server: String,
    /// The platform admin token (`sluice serve --admin-token`).
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// `text` for people, `json` for scripts.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

/// The platform admin's commands.
#[derive(Debug, clap::Subcommand)]
pub enum AdminCommand {
    /// Platform admin: list and create tenants.
    #[command(subcommand)]
    Tenants(TenantsCommand),
    /// Platform admin: issue and revoke tenants' API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Platform admin: change a tenant's quotas.
    #[command(subcommand)]
    Quotas(QuotasCommand),
    /// Platform admin: the server machine's devices (CPU, CUDA GPUs, a WebGPU adapter) and model memory.
    Devices {
        #[command(flatten)]
        connection: AdminConnection,
    },
}

/// Run one admin command and print its result.
pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Tenants(command) => tenants(command).await,
        AdminCommand::Keys(command) => keys(command).await,
        AdminCommand::Quotas(command) => quotas(command).await,
        AdminCommand::Devices { connection } => {
            let answer = client(&connection)?.send("GET", "/admin/v1/devices", None).await?;
            print(connection.output, &answer, render::devices(&answer))
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum TenantsCommand {
    /// Every tenant with its quotas and key ids.
    List {
        #[command(flatten)]
        connection: AdminConnection,
    },
    /// Create a tenant (default quotas unless `--set` changes some).
    Create {
        id: String,
        /// `QUOTA=VALUE`, repeatable (for example `max_concurrent_requests=8`).
        #[arg(long = "set")]
        set: Vec<String>,
        #[command(flatten)]
        connection: AdminConnection,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
    /// Issue a new API key for a tenant (shown once).
    Issue {
        tenant: String,
        #[command(flatten)]
        connection: AdminConnection,
    },
    /// Revoke a tenant's key by its id (from `sluice tenants list`).
    Revoke {
        tenant: String,
        key_id: String,
        #[command(flatten)]
        connection: AdminConnection,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum QuotasCommand {
    /// Change some of a tenant's quotas: `sluice quotas set TENANT QUOTA=VALUE…`.
    Set {
        tenant: String,
        #[arg(required = true)]
        changes: Vec<String>,
        #[command(flatten)]
        connection: AdminConnection,
    },
}

fn client(connection: &AdminConnection) -> anyhow::Result<ControlClient> {
    let token = connection
        .admin_token
        .clone()
        .context("no admin token: pass --admin-token or set SLUICE_ADMIN_TOKEN (the one `sluice serve` was given)")?;
    ControlClient::with_token(&connection.server, token)
}

/// `QUOTA=VALUE` pairs into `quotas` (numbers and booleans as JSON, anything else a string).
fn apply_changes(quotas: &mut Map<String, Value>, changes: &[String]) -> anyhow::Result<()> {
    for change in changes {
        let (name, value) = change
            .split_once('=')
            .with_context(|| format!("'{change}': expected QUOTA=VALUE, e.g. compute_weight=2"))?;
        let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()));
        quotas.insert(name.trim().to_string(), value);
    }
    Ok(())
}

fn print(output: Output, answer: &Value, text: String) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(answer)?),
        Output::Text => print!("{text}"),
    }
    Ok(())
}

async fn tenants(command: TenantsCommand) -> anyhow::Result<()> {
    match command {
        TenantsCommand::List { connection } => {
            let answer = client(&connection)?.send("GET", "/admin/v1/tenants", None).await?;
            let text = render::tenants(&answer);
            print(connection.output, &answer, text)
        }
        TenantsCommand::Create { id, set, connection } => {
            let mut quotas = Map::new();
            apply_changes(&mut quotas, &set)?;
            let body = json!({ "id": id, "quotas": quotas });
            let answer = client(&connection)?.send("POST", "/admin/v1/tenants", Some(body)).await?;
            print(
                connection.output,
                &answer,
                format!("tenant {id} created; issue it a key with `sluice keys issue {id}`\n"),
            )
        }
    }
}

async fn keys(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Issue { tenant, connection } => {
            let path = format!("/admin/v1/tenants/{tenant}/keys");
            let answer = client(&connection)?.send("POST", &path, None).await?;
            let text = format!(
                "{}\n(key id {}; the key is shown only now: hand it to tenant {tenant})\n",
                answer["key"].as_str().unwrap_or("?"),
                answer["key_id"].as_str().unwrap_or("?")
            );
            print(connection.output, &answer, text)
        }
        KeysCommand::Revoke { tenant, key_id, connection } => {
            let path = format!("/admin/v1/tenants/{tenant}/keys/{key_id}");
            let answer = client(&connection)?.send("DELETE", &path, None).await?;
            print(connection.output, &answer, format!("key {key_id} of tenant {tenant} revoked\n"))
        }
    }
}

async fn quotas(command: QuotasCommand) -> anyhow::Result<()> {
    let QuotasCommand::Set { tenant, changes, connection } = command;
    // Only the named quotas are sent: the server changes them on its newest state, so a
    // change made meanwhile by someone else to other quotas stays.
    let mut changed = Map::new();
    apply_changes(&mut changed, &changes)?;
    let path = format!("/admin/v1/tenants/{tenant}/quotas");
    let answer = client(&connection)?.send("PATCH", &path, Some(Value::Object(changed))).await?;
    print(connection.output, &answer, format!("quotas of tenant {tenant} set\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_changes_keep_their_json_types() {
        let mut quotas = Map::new();
        apply_changes(&mut quotas, &["compute_weight=2".into(), "allow_raw_model_load=true".into()]).expect("valid");
        assert_eq!(Value::Object(quotas), json!({ "compute_weight": 2, "allow_raw_model_load": true }));
        assert!(apply_changes(&mut Map::new(), &["compute_weight".into()]).is_err());
    }
}
