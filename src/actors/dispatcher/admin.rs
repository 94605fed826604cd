//! The Dispatcher's administration: registering and listing capabilities,
//! reloading the registry, agent bindings, deciding and listing approvals,
//! and reading provenance. The checks are `core::dispatch` functions; these
//! handlers read and write the store and keep the pipeline in step.

use super::{builtin_records, wall_ms, ApplyRegistryChange, Dispatcher};
use crate::core::dispatch::approval::{self, Approval};
use crate::core::dispatch::registry::{self, Binding, CapabilityRecord};
use crate::core::dispatch::shared::{RegistryChange, SharedError};
use crate::core::dispatch::ProvenanceRecord;
use crate::gateway::errors::ErrorKind;
use crate::store::StoreError;
use actix::prelude::*;

/// Why an admin request was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct AdminError {
    /// What went wrong; the gateway's table gives its status and code.
    pub kind: ErrorKind,
    pub message: String,
}

impl AdminError {
    fn new(kind: ErrorKind, message: impl Into<String>) -> AdminError {
        AdminError { kind, message: message.into() }
    }

    /// Returns its stable code.
    pub fn code(&self) -> &'static str {
        self.kind.status_and_code().1
    }
}

impl From<StoreError> for AdminError {
    fn from(err: StoreError) -> AdminError {
        let kind = if matches!(err, StoreError::Full { .. }) { ErrorKind::StorageFull } else { ErrorKind::Internal };
        AdminError::new(kind, err.to_string())
    }
}

/// Registers a new capability (`update: false`) or replaces one (`update: true`).
#[derive(Message, Debug)]
#[rtype(result = "Result<CapabilityRecord, AdminError>")]
pub struct RegisterCapability {
    pub record: CapabilityRecord,
    pub update: bool,
}

/// Lists the registry (built-ins included).
#[derive(Message, Debug, Default)]
#[rtype(result = "Vec<CapabilityRecord>")]
pub struct ListCapabilities;

/// Re-reads registry and bindings from the store (rate windows are kept).
#[derive(Message, Debug, Default)]
#[rtype(result = "Result<usize, AdminError>")]
pub struct ReloadRegistry;

/// Sets an agent's binding; answers the `${env:VAR}` names that are not set.
#[derive(Message, Debug)]
#[rtype(result = "Result<Vec<String>, AdminError>")]
pub struct SetBinding(pub Binding);

/// Lists bindings, of one agent or all.
#[derive(Message, Debug, Default)]
#[rtype(result = "Result<Vec<Binding>, AdminError>")]
pub struct ListBindings {
    pub agent_id: Option<String>,
}

/// Approves or rejects a pending approval on behalf of `by` (recorded as its `decidedBy`).
#[derive(Message, Debug)]
#[rtype(result = "Result<Approval, AdminError>")]
pub struct DecideApproval {
    pub id: String,
    pub approve: bool,
    pub by: String,
}

/// Lists approvals (only pending, unexpired ones when `pending_only`).
#[derive(Message, Debug, Default)]
#[rtype(result = "Result<Vec<Approval>, AdminError>")]
pub struct ListApprovals {
    pub pending_only: bool,
    /// Only this agent's approvals (the per-agent subject sets it).
    pub agent_id: Option<String>,
}

/// The newest provenance records.
#[derive(Message, Debug)]
#[rtype(result = "Result<Vec<ProvenanceRecord>, AdminError>")]
pub struct ListProvenance {
    pub limit: usize,
}

impl Handler<RegisterCapability> for Dispatcher {
    type Result = ResponseActFuture<Self, Result<CapabilityRecord, AdminError>>;

    fn handle(&mut self, msg: RegisterCapability, _: &mut Context<Self>) -> Self::Result {
        // Refused before the cluster is written: a refusal keeps nothing anywhere.
        if let Err(full) = self.store.check_space() {
            return Box::pin(fut::ready(Err(full.into())));
        }
        let record = match self.prepare_record(msg) {
            Ok(record) => record,
            Err(err) => return Box::pin(fut::ready(Err(err))),
        };
        let Some(shared) = self.shared.clone() else {
            return Box::pin(self.apply_record(record).into_actor(self));
        };
        // The cluster first: a new slug is created there only once.
        let create_only = record.policy_version == 1;
        let published = async move {
            let published = shared.publish_record(&record, create_only).await;
            (record, published)
        };
        Box::pin(published.into_actor(self).then(|(record, published), act, _| -> Self::Result {
            match published {
                Ok(true) => Box::pin(act.apply_record(record).into_actor(act)),
                Ok(false) => Box::pin(fut::ready(Err(already_registered(&record.slug)))),
                Err(err) => Box::pin(fut::ready(Err(AdminError::new(ErrorKind::Unavailable, err.to_string())))),
            }
        }))
    }
}

fn already_registered(slug: &str) -> AdminError {
    AdminError::new(ErrorKind::Conflict("already_registered"), format!("{slug} is registered; update it"))
}

impl Dispatcher {
    /// The record a registration stores, checked against the registry: its
    /// policy version is 1 when new, one more than the stored one on update.
    fn prepare_record(&self, msg: RegisterCapability) -> Result<CapabilityRecord, AdminError> {
        let mut record = msg.record;
        if builtin_records().iter().any(|b| b.slug == record.slug) {
            return Err(AdminError::new(
                ErrorKind::Conflict("builtin"),
                format!("{} is a built-in capability", record.slug),
            ));
        }
        registry::validate_record(&record, self.settings.max_id_bytes)
            .map_err(|err| AdminError::new(ErrorKind::Invalid(err.code()), err.to_string()))?;
        registry::check_record_env(&record, &self.settings.env_allow)
            .map_err(|err| AdminError::new(ErrorKind::Invalid(err.code()), err.to_string()))?;
        let existing = self.store.capability_record(&record.slug)?;
        record.policy_version = match (&existing, msg.update) {
            (Some(_), false) => return Err(already_registered(&record.slug)),
            (None, true) => {
                return Err(AdminError::new(
                    ErrorKind::NotFound("unknown_capability"),
                    format!("no capability {} is registered", record.slug),
                ))
            }
            (None, false) => 1,
            (Some(old), true) => old.policy_version + 1,
        };
        Ok(record)
    }

    /// Stores a record, reloads the registry (rate windows stay) and offers
    /// it to discovery; resolves once discovery has it.
    fn apply_record(
        &mut self,
        record: CapabilityRecord,
    ) -> impl std::future::Future<Output = Result<CapabilityRecord, AdminError>> + 'static {
        let stored = (|| {
            self.store.put_capability_record(&record)?;
            self.store.flush()?;
            self.pipeline.load_registry(Dispatcher::registry_of(&self.store)?);
            Ok::<(), AdminError>(())
        })();
        let synced = self.sync_catalog();
        async move {
            stored?;
            synced.await;
            Ok(record)
        }
    }
}

impl Handler<ApplyRegistryChange> for Dispatcher {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: ApplyRegistryChange, _: &mut Context<Self>) -> Self::Result {
        match msg.0 {
            RegistryChange::Record(record) => {
                let known = self.store.capability_record(&record.slug).ok().flatten();
                if known.as_ref() == Some(&*record) || builtin_records().iter().any(|b| b.slug == record.slug) {
                    return Box::pin(async {});
                }
                let applied = self.apply_record(*record);
                Box::pin(async move {
                    if let Err(err) = applied.await {
                        tracing::warn!(%err, "a capability record of the cluster was not applied");
                    }
                })
            }
            RegistryChange::Binding(binding) => {
                let known = self.store.bindings().unwrap_or_default();
                if !known.contains(&binding) {
                    if let Err(err) = self.store.put_binding(&binding) {
                        tracing::warn!(%err, "a binding of the cluster was not applied");
                    }
                    self.pipeline.set_binding(binding);
                }
                Box::pin(async {})
            }
        }
    }
}

impl Handler<ListCapabilities> for Dispatcher {
    type Result = MessageResult<ListCapabilities>;

    fn handle(&mut self, _: ListCapabilities, _: &mut Context<Self>) -> Self::Result {
        let mut records: Vec<CapabilityRecord> = builtin_records();
        records.extend(self.store.capability_records().unwrap_or_default());
        MessageResult(records)
    }
}

impl Handler<ReloadRegistry> for Dispatcher {
    type Result = ResponseFuture<Result<usize, AdminError>>;

    fn handle(&mut self, _: ReloadRegistry, _: &mut Context<Self>) -> Self::Result {
        let reloaded = (|| {
            let records = Dispatcher::registry_of(&self.store)?;
            let count = records.len();
            self.pipeline.load_registry(records);
            self.pipeline.load_bindings(self.store.bindings()?);
            Ok::<usize, AdminError>(count)
        })();
        let synced = self.sync_catalog();
        Box::pin(async move {
            let count = reloaded?;
            synced.await;
            Ok(count)
        })
    }
}

impl Handler<SetBinding> for Dispatcher {
    type Result = ResponseActFuture<Self, Result<Vec<String>, AdminError>>;

    fn handle(&mut self, msg: SetBinding, _: &mut Context<Self>) -> Self::Result {
        if let Err(full) = self.store.check_space() {
            return Box::pin(fut::ready(Err(full.into())));
        }
        let binding = msg.0;
        let env = self.env.clone();
        let checked = registry::validate_binding(&binding, &|name| env(name), self.settings.max_id_bytes)
            .map_err(|err| AdminError::new(ErrorKind::Invalid("invalid_binding"), err.to_string()))
            .and_then(|missing| {
                registry::check_binding_env(&binding, &self.settings.env_allow)
                    .map(|()| missing)
                    .map_err(|err| AdminError::new(ErrorKind::Invalid(err.code()), err.to_string()))
            })
            .and_then(|missing| match self.pipeline.record(&binding.slug) {
                Some(_) => Ok(missing),
                None => Err(AdminError::new(
                    ErrorKind::NotFound("unknown_capability"),
                    format!("no capability {} is registered", binding.slug),
                )),
            });
        let missing = match checked {
            Ok(missing) => missing,
            Err(err) => return Box::pin(fut::ready(Err(err))),
        };
        let published = match self.shared.clone() {
            Some(shared) => {
                let binding = binding.clone();
                futures::future::Either::Left(async move { shared.publish_binding(&binding, false).await.map(|_| ()) })
            }
            None => futures::future::Either::Right(std::future::ready(Ok(()))),
        };
        Box::pin(published.into_actor(self).map(move |published, act, _| {
            published.map_err(|err| AdminError::new(ErrorKind::Unavailable, err.to_string()))?;
            act.store.put_binding(&binding)?;
            act.store.flush()?;
            act.pipeline.set_binding(binding);
            Ok(missing)
        }))
    }
}

impl Handler<ListBindings> for Dispatcher {
    type Result = Result<Vec<Binding>, AdminError>;

    fn handle(&mut self, msg: ListBindings, _: &mut Context<Self>) -> Self::Result {
        let mut bindings = self.store.bindings()?;
        if let Some(agent) = &msg.agent_id {
            bindings.retain(|b| &b.agent_id == agent);
        }
        Ok(bindings)
    }
}

impl Handler<DecideApproval> for Dispatcher {
    type Result = ResponseFuture<Result<Approval, AdminError>>;

    fn handle(&mut self, msg: DecideApproval, _: &mut Context<Self>) -> Self::Result {
        if let Err(full) = self.store.check_space() {
            return Box::pin(futures::future::ready(Err(full.into())));
        }
        let store = self.store.clone();
        let shared = self.shared.clone();
        let max_id_bytes = self.settings.max_id_bytes;
        Box::pin(async move {
            let unknown =
                || AdminError::new(ErrorKind::NotFound("unknown_approval"), format!("approval {} is unknown", msg.id));
            let invalid = |problem: approval::ApprovalProblem| match problem {
                approval::ApprovalProblem::SelfApproval { .. } => {
                    AdminError::new(ErrorKind::Forbidden("self_approval"), problem.to_string())
                }
                _ => AdminError::new(ErrorKind::Conflict("approval_invalid"), problem.to_string()),
            };
            approval::check_decider(&msg.by, max_id_bytes)
                .map_err(|problem| AdminError::new(ErrorKind::BadRequest, problem.to_string()))?;
            let Some(shared) = shared else {
                let mut found = store.approval(&msg.id)?.ok_or_else(unknown)?;
                approval::decide(&mut found, msg.approve, wall_ms(), &msg.by).map_err(invalid)?;
                store.put_approval(&found)?;
                store.durable().await?;
                return Ok(found);
            };
            // The cluster's copy is the truth: decided once, whichever node is asked.
            let unavailable = |err: SharedError| AdminError::new(ErrorKind::Unavailable, err.to_string());
            let found = shared.approval(&msg.id).await.map_err(unavailable)?.ok_or_else(unknown)?;
            let mut decided = found.value;
            approval::decide(&mut decided, msg.approve, wall_ms(), &msg.by).map_err(invalid)?;
            if !shared.put_approval(&decided, Some(found.revision)).await.map_err(unavailable)? {
                return Err(invalid(approval::ApprovalProblem::AlreadyDecided(msg.id)));
            }
            store.put_approval(&decided)?;
            Ok(decided)
        })
    }
}

impl Handler<ListApprovals> for Dispatcher {
    type Result = Result<Vec<Approval>, AdminError>;

    fn handle(&mut self, msg: ListApprovals, _: &mut Context<Self>) -> Self::Result {
        let now_ms = wall_ms();
        let mut approvals = self.store.approvals()?;
        if msg.pending_only {
            approvals.retain(|a| approval::is_open(a, now_ms));
        }
        if let Some(agent) = &msg.agent_id {
            approvals.retain(|a| &a.agent_id == agent);
        }
        Ok(approvals)
    }
}

impl Handler<ListProvenance> for Dispatcher {
    type Result = Result<Vec<ProvenanceRecord>, AdminError>;

    fn handle(&mut self, msg: ListProvenance, _: &mut Context<Self>) -> Self::Result {
        Ok(self.store.provenance(msg.limit)?)
    }
}
