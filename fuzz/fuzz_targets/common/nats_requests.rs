// Shared by `nats_request_json` and `nats_request_msgpack` (included, not a module).
// Decodes one body as the request of every subject, as `gateway::service` does,
// and runs the checks that follow the decode there: any body is a request or a
// typed refusal, never a panic.

use capdex::core::dispatch::pipeline::DispatchCall;
use capdex::core::dispatch::registry::{validate_binding, validate_record, Binding, CapabilityRecord};
use capdex::core::kpi_window::{OutcomeLimits, OutcomeReport};
use capdex::core::limits::Limits;
use capdex::core::registration::{normalise_registration, RegistrationPayload};
use capdex::core::sources::settings::SourceSettings;
use capdex::gateway::wire::{
    bind_identity, Codec, DecideRequest, DiscoverRequest, ListRequest, PlanRequest, RemoveRequest, ScgDepositRequest,
    ScgMapRequest, ScgObserveRequest, ScgRouteRequest, SearchRequest,
};

const MAX: usize = 1024 * 1024;
/// `[limits] max_id_bytes` as shipped.
const MAX_ID_BYTES: usize = 128;

fn exercise(codec: Codec, data: &[u8]) {
    // discover, search, plan
    if let Ok(request) = codec.decode::<DiscoverRequest>(data, MAX) {
        let _ = request.filter(&Limits::default());
    }
    if let Ok(request) = codec.decode::<SearchRequest>(data, MAX) {
        let _ = request.into_discover().filter(&Limits::default());
    }
    if let Ok(request) = codec.decode::<PlanRequest>(data, MAX) {
        if let Ok(discover) = request.into_discover(&Limits::default()) {
            let _ = discover.filter(&Limits::default());
        }
    }
    // outcome
    if let Ok(report) = codec.decode::<OutcomeReport>(data, MAX) {
        let _ = report.validate(1_700_000_000_000, OutcomeLimits::default());
    }
    // capabilities.upsert, .remove, .list
    if let Ok(payload) = codec.decode::<RegistrationPayload>(data, MAX) {
        let _ = normalise_registration(&payload, MAX_ID_BYTES);
    }
    let _ = codec.decode::<RemoveRequest>(data, MAX);
    let _ = codec.decode::<ListRequest>(data, MAX);
    // map, route, observe, memory.deposit
    let _ = codec.decode::<ScgMapRequest>(data, MAX);
    let _ = codec.decode::<ScgRouteRequest>(data, MAX);
    if let Ok(request) = codec.decode::<ScgObserveRequest>(data, MAX) {
        let _ = request.edge_kinds(MAX_ID_BYTES);
    }
    if let Ok(request) = codec.decode::<ScgDepositRequest>(data, MAX) {
        if let Ok(deposit) = request.deposit() {
            let _ = capdex::core::scg::memory::validate(&deposit, &Limits::default());
        }
    }
    // The bodies served as JSON values: dispatch (plain and per agent), the
    // dispatch administration, approvals (plain and per approver), sources.
    let Ok(body) = codec.decode::<serde_json::Value>(data, MAX) else { return };
    let mut bound = body.clone();
    if bind_identity(&mut bound, "agentId", "alpha", MAX_ID_BYTES).is_ok() {
        assert_eq!(bound["agentId"], "alpha", "a bound body names the subject's agent");
    }
    if let Ok(mut call) = serde_json::from_value::<DispatchCall>(body.clone()) {
        let _ = call.check(MAX_ID_BYTES);
    }
    if let Ok(record) = serde_json::from_value::<CapabilityRecord>(body.clone()) {
        let _ = validate_record(&record, MAX_ID_BYTES);
    }
    if let Ok(binding) = serde_json::from_value::<Binding>(body.clone()) {
        let _ = validate_binding(&binding, &|_| None, MAX_ID_BYTES);
    }
    let mut by = body.clone();
    if bind_identity(&mut by, "by", "ops", MAX_ID_BYTES).is_ok() {
        assert_eq!(DecideRequest::decider(by, MAX_ID_BYTES).ok().as_deref().unwrap_or("ops"), "ops");
    }
    let _ = DecideRequest::decider(body.clone(), MAX_ID_BYTES);
    if let Ok(settings) = serde_json::from_value::<SourceSettings>(body) {
        let _ = settings.validate();
    }
}
