//! Helpers for the actors' unit tests: descriptors to index, and a fake
//! recipient that keeps what it is sent.

use crate::core::descriptor::CapabilityDescriptor;
use actix::prelude::*;
use std::sync::{Arc, Mutex};

/// A tool `tool:<name>` with `description`.
pub fn tool(name: &str, description: &str) -> CapabilityDescriptor {
    crate::core::descriptor::test_tool(name, description)
}

/// An actor that keeps every `M` it is sent, for a test to read.
pub struct Collector<M> {
    pub received: Arc<Mutex<Vec<M>>>,
}

impl<M: 'static + Unpin> Actor for Collector<M> {
    type Context = Context<Self>;
}

impl<M: Message<Result = ()> + 'static + Unpin> Handler<M> for Collector<M> {
    type Result = ();

    fn handle(&mut self, msg: M, _: &mut Context<Self>) {
        self.received.lock().unwrap().push(msg);
    }
}

/// Starts a [`Collector`]; returns its recipient and what it received.
pub fn collector<M: Message<Result = ()> + Send + 'static + Unpin>() -> (Recipient<M>, Arc<Mutex<Vec<M>>>) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let addr = Collector { received: received.clone() }.start();
    (addr.recipient(), received)
}
