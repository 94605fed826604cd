//! The dispatch pipeline's administration, shared by NATS and the CLI:
//! [`admin`] answers the `capability.*`, `binding.*`, `approval.*` and
//! `provenance.list` requests; the `run_*` functions are the `capdex
//! dispatch`, `capdex capability`, `capdex binding` and `capdex approval`
//! commands, in-process on the data dir (no NATS unless asked for).

use crate::actors::dispatcher::{
    AdminError, DecideApproval, Dispatch, Dispatcher, ListApprovals, ListBindings, ListCapabilities, ListProvenance,
    RegisterCapability, ReloadRegistry, SetBinding, SetTransport,
};
use crate::config::Settings;
use crate::core::dispatch::pipeline::DispatchCall;
use crate::core::dispatch::registry::{Binding, CapabilityRecord};
use crate::core::dispatch::CallResult;
use crate::gateway::wire::{ApiError, DispatchAdmin};
use crate::store::Store;
use actix::prelude::*;
use anyhow::Context as _;
use serde::Deserialize;
use serde_json::{json, Value};

/// The most provenance records one request returns.
pub const MAX_PROVENANCE: usize = 1000;

fn admin_error(err: AdminError) -> ApiError {
    ApiError::new(err.kind, err.message)
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, body: Value) -> Result<T, ApiError> {
    serde_json::from_value(body).map_err(|err| ApiError::bad_request(format!("malformed {what}: {err}")))
}

fn unavailable(err: MailboxError) -> ApiError {
    ApiError::unavailable(err)
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<Value, ApiError> {
    serde_json::to_value(value).map_err(|err| ApiError::internal(err.to_string()))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AgentFilter {
    #[serde(default)]
    agent_id: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApprovalFilter {
    /// Every approval, not only pending ones.
    #[serde(default)]
    all: bool,
    /// Only this agent's approvals.
    #[serde(default)]
    agent_id: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Limit {
    #[serde(default)]
    limit: Option<usize>,
}

async fn register(dispatcher: Addr<Dispatcher>, body: Value, update: bool) -> Result<Value, ApiError> {
    let record: CapabilityRecord = decode("capability record", body)?;
    let record =
        dispatcher.send(RegisterCapability { record, update }).await.map_err(unavailable)?.map_err(admin_error)?;
    to_json(&record)
}

/// Answers one dispatch admin request.
pub async fn admin(dispatcher: Addr<Dispatcher>, request: DispatchAdmin) -> Result<Value, ApiError> {
    match request {
        DispatchAdmin::Register(body) => register(dispatcher, body, false).await,
        DispatchAdmin::Update(body) => register(dispatcher, body, true).await,
        DispatchAdmin::List => {
            let records = dispatcher.send(ListCapabilities).await.map_err(unavailable)?;
            Ok(json!({"capabilities": to_json(&records)?}))
        }
        DispatchAdmin::Reload => {
            let count = dispatcher.send(ReloadRegistry).await.map_err(unavailable)?.map_err(admin_error)?;
            Ok(json!({"capabilities": count}))
        }
        DispatchAdmin::SetBinding(body) => {
            let binding: Binding = decode("binding", body)?;
            let missing =
                dispatcher.send(SetBinding(binding.clone())).await.map_err(unavailable)?.map_err(admin_error)?;
            Ok(json!({"binding": to_json(&binding)?, "warnings": {"missingEnvVars": missing}}))
        }
        DispatchAdmin::ListBindings(body) => {
            let filter: AgentFilter = decode("binding filter", body)?;
            let bindings = dispatcher
                .send(ListBindings { agent_id: filter.agent_id })
                .await
                .map_err(unavailable)?
                .map_err(admin_error)?;
            Ok(json!({"bindings": to_json(&bindings)?}))
        }
        DispatchAdmin::ListApprovals(body) => {
            let filter: ApprovalFilter = decode("approval filter", body)?;
            let approvals = dispatcher
                .send(ListApprovals { pending_only: !filter.all, agent_id: filter.agent_id })
                .await
                .map_err(unavailable)?
                .map_err(admin_error)?;
            Ok(json!({"approvals": to_json(&approvals)?}))
        }
        DispatchAdmin::Decide { id, approve, by } => {
            let approval =
                dispatcher.send(DecideApproval { id, approve, by }).await.map_err(unavailable)?.map_err(admin_error)?;
            to_json(&approval)
        }
        DispatchAdmin::ListProvenance(body) => {
            let limit: Limit = decode("provenance request", body)?;
            let limit = limit.limit.unwrap_or(100).clamp(1, MAX_PROVENANCE);
            let records = dispatcher.send(ListProvenance { limit }).await.map_err(unavailable)?.map_err(admin_error)?;
            Ok(json!({"provenance": to_json(&records)?}))
        }
    }
}

/// Opens the data dir and starts a dispatcher on the current System; with
/// `nats`, internal capabilities without an in-process handler go to their
/// handler services over the configured NATS server.
pub async fn start_dispatcher(settings: &Settings, nats: bool) -> anyhow::Result<Addr<Dispatcher>> {
    std::fs::create_dir_all(&settings.data_dir)
        .with_context(|| format!("failed to create data_dir {}", settings.data_dir.display()))?;
    let store = Store::open(&settings.data_dir)?;
    let dispatcher = Dispatcher::new(store, settings.dispatch.clone())?.start();
    if nats {
        let gateway = crate::gateway::service::Gateway::connect(&settings.nats).await?;
        dispatcher.send(SetTransport(std::sync::Arc::new(gateway.exec_transport()))).await?;
        // The client lives as long as the transport holds it.
        std::mem::forget(gateway);
    }
    Ok(dispatcher)
}

/// `capdex dispatch`: runs one call and returns its result.
pub async fn run_dispatch(settings: &Settings, call: DispatchCall, nats: bool) -> anyhow::Result<CallResult> {
    let dispatcher = start_dispatcher(settings, nats).await?;
    let result = dispatcher.send(Dispatch { call }).await.context("the dispatcher stopped")?;
    Ok(result)
}

/// `capdex capability|binding|approval ...`: one admin request in-process.
pub async fn run_admin(settings: &Settings, request: DispatchAdmin) -> anyhow::Result<Value> {
    let dispatcher = start_dispatcher(settings, false).await?;
    admin(dispatcher, request).await.map_err(|err| anyhow::anyhow!("{}: {}", err.code(), err.message))
}

/// Reads a JSON (or YAML) file for `capdex capability register|update` and `capdex binding set`.
pub fn read_document(path: &std::path::Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("failed to read {}", path.display()))?;
    match serde_json::from_str(&text) {
        Ok(value) => Ok(value),
        Err(json_err) => serde_norway::from_str(&text)
            .with_context(|| format!("{} is neither JSON ({json_err}) nor YAML", path.display())),
    }
}
