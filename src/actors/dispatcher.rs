//! Dispatcher: runs capability calls through the pipeline of
//! `core::dispatch_rules` (resolve, availability, JSON-Schema validation,
//! execute), with idempotent re-drive: a result is stored under its
//! idempotency key (and flushed) before it is returned, so a repeated call, or
//! one re-driven after a crash, gets the first result and never runs twice.

use crate::actors::indexer::CatalogPublished;
use crate::actors::Observe;
use crate::core::catalog::Catalog;
use crate::core::dispatch_rules::{check, DispatchError, DispatchRequest};
use crate::store::{Store, StoreError};
use actix::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Runs one capability call.
#[derive(Message, Debug)]
#[rtype(result = "Result<DispatchReply, DispatchFailure>")]
pub struct Dispatch {
    pub request: DispatchRequest,
}

/// The result of a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatchReply {
    pub capability_id: String,
    pub output: serde_json::Value,
    /// True when this is the stored result of an earlier call with the same key.
    pub replayed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchFailure {
    #[error(transparent)]
    Refused(#[from] DispatchError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the dispatcher has done.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DispatcherStats {
    pub executed: u64,
    pub replayed: u64,
    pub refused: u64,
}

pub struct Dispatcher {
    store: Store,
    catalog: Arc<Catalog>,
    stats: DispatcherStats,
}

impl Dispatcher {
    pub fn new(store: Store) -> Dispatcher {
        Dispatcher { store, catalog: Arc::new(Catalog::default()), stats: DispatcherStats::default() }
    }

    fn run(&mut self, request: DispatchRequest) -> Result<DispatchReply, DispatchFailure> {
        if let Some(key) = &request.idempotency_key {
            if let Some(mut earlier) = self.store.dispatch_result::<DispatchReply>(key)? {
                if earlier.capability_id == request.capability_id {
                    self.stats.replayed += 1;
                    earlier.replayed = true;
                    return Ok(earlier);
                }
            }
        }
        let builtin = check(&request, self.catalog.get(&request.capability_id))?;
        let reply = DispatchReply {
            capability_id: request.capability_id.clone(),
            output: builtin.run(&request.arguments),
            replayed: false,
        };
        if let Some(key) = &request.idempotency_key {
            self.store.put_dispatch_result(key, &reply)?;
            self.store.flush()?;
        }
        self.stats.executed += 1;
        Ok(reply)
    }
}

impl Actor for Dispatcher {
    type Context = Context<Self>;
}

impl Handler<CatalogPublished> for Dispatcher {
    type Result = ();

    fn handle(&mut self, msg: CatalogPublished, _: &mut Context<Self>) {
        self.catalog = msg.catalog;
    }
}

impl Handler<Dispatch> for Dispatcher {
    type Result = Result<DispatchReply, DispatchFailure>;

    fn handle(&mut self, msg: Dispatch, _: &mut Context<Self>) -> Self::Result {
        let result = self.run(msg.request);
        let outcome = match &result {
            Ok(reply) if reply.replayed => "replayed",
            Ok(_) => "executed",
            Err(_) => {
                self.stats.refused += 1;
                "refused"
            }
        };
        metrics::counter!("capdex_dispatch_total", "outcome" => outcome).increment(1);
        result
    }
}

impl Handler<Observe<DispatcherStats>> for Dispatcher {
    type Result = MessageResult<Observe<DispatcherStats>>;

    fn handle(&mut self, _: Observe<DispatcherStats>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats.clone())
    }
}
