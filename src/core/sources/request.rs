//! An HTTP request from an OpenAPI operation and a call's arguments
//! ([`build_request`]): path parameters percent-encoded into their segment
//! (a value never adds a segment, a query or a fragment, and never is a dot
//! segment), query parameters (arrays repeated), header parameters, the other
//! arguments as the JSON body, then the source's auth. Pure: the shell
//! (`upstream::http`) sends the [`HttpRequestPlan`].

use crate::core::dispatch::ErrorCode;
use crate::core::sources::settings::{is_header_name, ResolvedAuth};
use crate::core::sources::{HttpOperation, ParamLocation};
use serde_json::{Map, Value};

/// What to send: method, full URL, headers and an optional JSON body.
#[derive(Clone, PartialEq)]
pub struct HttpRequestPlan {
    /// Upper-case method.
    pub method: String,
    /// `base_url` joined with the filled path, then the query.
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Value>,
}

impl std::fmt::Debug for HttpRequestPlan {
    /// Header values may be secrets (auth): only their names are printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRequestPlan")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("headers", &self.headers.iter().map(|(name, _)| name).collect::<Vec<_>>())
            .field("body", &self.body.is_some())
            .finish()
    }
}

/// Why no request could be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the arguments must be a JSON object")]
    ArgumentsNotObject,
    #[error("the required parameter {0} is missing")]
    MissingParam(String),
    #[error("the parameter {name} is invalid: {problem}")]
    InvalidParam { name: String, problem: String },
    #[error("the operation has no usable base URL ({0})")]
    BadBaseUrl(String),
    #[error("the operation is malformed: {0}")]
    BadOperation(String),
}

impl RequestError {
    /// The call's error code: `invalid_args` for the arguments' faults, `invalid_binding` for the operation's.
    pub fn code(&self) -> ErrorCode {
        match self {
            RequestError::ArgumentsNotObject | RequestError::MissingParam(_) | RequestError::InvalidParam { .. } => {
                ErrorCode::InvalidArgs
            }
            RequestError::BadBaseUrl(_) | RequestError::BadOperation(_) => ErrorCode::InvalidBinding,
        }
    }
}

/// Builds the request of one call of `op` with `arguments` (an object, or
/// null for none), and `auth` applied last (it wins over a same-named header
/// or query argument). A `null` argument counts as absent. Arguments that
/// are not parameters form the JSON body when `op.json_body` (the argument
/// `body` alone is the whole body), and are ignored otherwise (schema
/// validation before dispatch refuses unknown arguments where the schema says so).
///
/// # Examples
/// ```
/// use capdex::core::sources::{HttpOperation, OperationParam, ParamLocation};
/// use capdex::core::sources::request::build_request;
/// let op = HttpOperation {
///     method: "GET".into(),
///     base_url: "http://127.0.0.1:8080/v1/".into(),
///     path: "/pets/{petId}".into(),
///     params: vec![OperationParam { name: "petId".into(), location: ParamLocation::Path, required: true }],
///     json_body: false,
/// };
/// let plan = build_request(&op, &serde_json::json!({"petId": "a/b"}), None).unwrap();
/// assert_eq!(plan.url, "http://127.0.0.1:8080/v1/pets/a%2Fb");
/// ```
pub fn build_request(
    op: &HttpOperation,
    arguments: &Value,
    auth: Option<&ResolvedAuth>,
) -> Result<HttpRequestPlan, RequestError> {
    let empty = Map::new();
    let args = match arguments {
        Value::Object(map) => map,
        Value::Null => &empty,
        _ => return Err(RequestError::ArgumentsNotObject),
    };
    let method = op.method.trim().to_ascii_uppercase();
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(RequestError::BadOperation(format!("{:?} is not an HTTP method", op.method)));
    }
    let base = base_url(&op.base_url)?;
    let path = fill_path(op, args)?;

    let mut query: Vec<(String, String)> = Vec::new();
    let mut headers: Vec<(String, String)> = Vec::new();
    for param in &op.params {
        let value = args.get(&param.name).filter(|v| !v.is_null());
        match (param.location, value) {
            (ParamLocation::Path, _) => {}
            (_, None) if param.required => return Err(RequestError::MissingParam(param.name.clone())),
            (_, None) => {}
            (ParamLocation::Query, Some(Value::Array(items))) => {
                for item in items.iter().filter(|item| !item.is_null()) {
                    query.push((param.name.clone(), scalar_text(item)));
                }
            }
            (ParamLocation::Query, Some(value)) => query.push((param.name.clone(), scalar_text(value))),
            (ParamLocation::Header, Some(value)) => {
                if !is_header_name(&param.name) {
                    return Err(RequestError::BadOperation(format!("{:?} is not a header name", param.name)));
                }
                let text = match value {
                    Value::Array(items) => items.iter().map(scalar_text).collect::<Vec<_>>().join(","),
                    other => scalar_text(other),
                };
                if text.chars().any(|c| c.is_control() && c != '\t') {
                    return Err(RequestError::InvalidParam {
                        name: param.name.clone(),
                        problem: "a header value cannot hold control characters".into(),
                    });
                }
                headers.push((param.name.clone(), text));
            }
        }
    }

    let body = if op.json_body {
        let rest: Map<String, Value> = args
            .iter()
            .filter(|(name, _)| !op.params.iter().any(|p| &p.name == *name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        match rest.len() {
            0 => None,
            // A body that is not an object (or is given whole) comes as the argument `body`.
            1 if rest.contains_key("body") => rest.get("body").cloned(),
            _ => Some(Value::Object(rest)),
        }
    } else {
        None
    };
    if body.is_some() && !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-type")) {
        headers.push(("Content-Type".into(), "application/json".into()));
    }

    match auth {
        None => {}
        Some(ResolvedAuth::Bearer { token }) => {
            headers.retain(|(name, _)| !name.eq_ignore_ascii_case("authorization"));
            headers.push(("Authorization".into(), format!("Bearer {token}")));
        }
        Some(ResolvedAuth::Header { name, value }) => {
            headers.retain(|(existing, _)| !existing.eq_ignore_ascii_case(name));
            headers.push((name.clone(), value.clone()));
        }
        Some(ResolvedAuth::Query { name, value }) => {
            query.retain(|(existing, _)| existing != name);
            query.push((name.clone(), value.clone()));
        }
    }

    let mut url = format!("{base}{path}");
    for (idx, (name, value)) in query.iter().enumerate() {
        url.push(if idx == 0 { '?' } else { '&' });
        url.push_str(&percent_encode(name));
        url.push('=');
        url.push_str(&percent_encode(value));
    }
    Ok(HttpRequestPlan { method, url, headers, body })
}

/// The base URL without its trailing `/`; an error unless `http(s)://host...` with no query or fragment.
fn base_url(base: &str) -> Result<&str, RequestError> {
    let base = base.trim();
    if base.is_empty() {
        return Err(RequestError::BadBaseUrl("it is empty; set the source's baseUrl".into()));
    }
    let rest = base
        .strip_prefix("http://")
        .or_else(|| base.strip_prefix("https://"))
        .ok_or_else(|| RequestError::BadBaseUrl(format!("{base:?} is not an http or https URL")))?;
    if rest.split('/').next().is_none_or(str::is_empty) {
        return Err(RequestError::BadBaseUrl(format!("{base:?} has no host")));
    }
    if base.contains(['?', '#']) || base.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(RequestError::BadBaseUrl(format!("{base:?} holds a query, a fragment or whitespace")));
    }
    Ok(base.trim_end_matches('/'))
}

/// The path template with every `{name}` replaced by its encoded argument.
fn fill_path(op: &HttpOperation, args: &Map<String, Value>) -> Result<String, RequestError> {
    let template = op.path.trim();
    if !template.starts_with('/') || template.contains(['?', '#']) {
        return Err(RequestError::BadOperation(format!("the path {template:?} must start with '/' and hold no query")));
    }
    let mut out = String::with_capacity(template.len() + 16);
    for (idx, segment) in template.split('/').enumerate() {
        if idx > 0 {
            out.push('/');
        }
        if !segment.contains('{') {
            out.push_str(segment);
            continue;
        }
        let mut filled = String::new();
        let mut rest = segment;
        while let Some(open) = rest.find('{') {
            filled.push_str(&rest[..open]);
            let close = rest[open..]
                .find('}')
                .map(|at| open + at)
                .ok_or_else(|| RequestError::BadOperation(format!("unclosed '{{' in {template:?}")))?;
            let name = &rest[open + 1..close];
            let value =
                args.get(name).filter(|v| !v.is_null()).ok_or_else(|| RequestError::MissingParam(name.into()))?;
            let text = match value {
                Value::Array(_) | Value::Object(_) => {
                    return Err(RequestError::InvalidParam {
                        name: name.into(),
                        problem: "a path parameter must be a string, number or boolean".into(),
                    })
                }
                other => scalar_text(other),
            };
            if text.is_empty() {
                return Err(RequestError::InvalidParam {
                    name: name.into(),
                    problem: "a path parameter cannot be empty".into(),
                });
            }
            filled.push_str(&percent_encode(&text));
            rest = &rest[close + 1..];
        }
        filled.push_str(rest);
        // `.`, `..` and their encoded forms are dot segments to URL parsers: they would move the path.
        let decoded_dots = filled.to_ascii_lowercase().replace("%2e", ".");
        if decoded_dots == "." || decoded_dots == ".." {
            return Err(RequestError::InvalidParam {
                name: segment.into(),
                problem: "a path parameter cannot make the segment '.' or '..'".into(),
            });
        }
        out.push_str(&filled);
    }
    Ok(out)
}

/// A scalar as text: strings as is, numbers and booleans as JSON, objects and arrays as JSON text.
fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Percent-encodes every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`).
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::sources::OperationParam;
    use proptest::prelude::*;
    use serde_json::json;

    fn param(name: &str, location: ParamLocation, required: bool) -> OperationParam {
        OperationParam { name: name.into(), location, required }
    }

    fn op(method: &str, path: &str, params: Vec<OperationParam>, json_body: bool) -> HttpOperation {
        HttpOperation {
            method: method.into(),
            base_url: "https://api.test/v1".into(),
            path: path.into(),
            params,
            json_body,
        }
    }

    fn check(op: &HttpOperation, args: Value, expect: Result<&str, RequestError>) {
        let got = build_request(op, &args, None).map(|plan| plan.url);
        assert_eq!(got, expect.map(str::to_string), "{args}");
    }

    fn percent_decode(text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        let mut idx = 0;
        while idx < bytes.len() {
            if bytes[idx] == b'%' {
                out.push(u8::from_str_radix(&text[idx + 1..idx + 3], 16).unwrap());
                idx += 3;
            } else {
                out.push(bytes[idx]);
                idx += 1;
            }
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn paths_queries_and_headers_are_filled() {
        let get = op(
            "get",
            "/pets/{petId}/photos/{n}.json",
            vec![
                param("petId", ParamLocation::Path, true),
                param("n", ParamLocation::Path, true),
                param("tag", ParamLocation::Query, false),
                param("limit", ParamLocation::Query, true),
                param("X-Trace", ParamLocation::Header, false),
            ],
            false,
        );
        check(
            &get,
            json!({"petId": "a b", "n": 3, "limit": 10}),
            Ok("https://api.test/v1/pets/a%20b/photos/3.json?limit=10"),
        );
        check(
            &get,
            json!({"petId": "x", "n": 1, "limit": 1, "tag": ["a&b", "c=d", null]}),
            Ok("https://api.test/v1/pets/x/photos/1.json?tag=a%26b&tag=c%3Dd&limit=1"),
        );
        check(&get, json!({"petId": "x", "n": 1}), Err(RequestError::MissingParam("limit".into())));
        check(&get, json!({"n": 1, "limit": 1}), Err(RequestError::MissingParam("petId".into())));
        check(&get, json!({"petId": null, "n": 1, "limit": 1}), Err(RequestError::MissingParam("petId".into())));
        check(&get, json!([1]), Err(RequestError::ArgumentsNotObject));
        let plan = build_request(&get, &json!({"petId": "x", "n": 1, "limit": 1, "X-Trace": "t1"}), None).unwrap();
        assert_eq!(plan.method, "GET");
        assert_eq!(plan.headers, vec![("X-Trace".to_string(), "t1".to_string())]);
        assert_eq!(plan.body, None);
        assert!(matches!(
            build_request(&get, &json!({"petId": "x", "n": 1, "limit": 1, "X-Trace": "a\r\nInjected: 1"}), None),
            Err(RequestError::InvalidParam { .. })
        ));
    }

    #[test]
    fn path_values_cannot_move_the_path() {
        let get = op("GET", "/files/{name}", vec![param("name", ParamLocation::Path, true)], false);
        check(&get, json!({"name": "../../admin?x=1#f"}), Ok("https://api.test/v1/files/..%2F..%2Fadmin%3Fx%3D1%23f"));
        for dots in ["..", ".", ""] {
            assert!(matches!(
                build_request(&get, &json!({"name": dots}), None),
                Err(RequestError::InvalidParam { .. })
            ));
        }
        check(
            &get,
            json!({"name": {"a": 1}}),
            Err(RequestError::InvalidParam {
                name: "name".into(),
                problem: "a path parameter must be a string, number or boolean".into(),
            }),
        );
    }

    #[test]
    fn the_rest_is_the_json_body() {
        let post = op("POST", "/pets", vec![param("dry", ParamLocation::Query, false)], true);
        let plan = build_request(&post, &json!({"name": "Rex", "age": 3, "dry": true}), None).unwrap();
        assert_eq!(plan.url, "https://api.test/v1/pets?dry=true");
        assert_eq!(plan.body, Some(json!({"name": "Rex", "age": 3})));
        assert!(plan.headers.contains(&("Content-Type".into(), "application/json".into())));
        let whole = build_request(&post, &json!({"body": [1, 2]}), None).unwrap();
        assert_eq!(whole.body, Some(json!([1, 2])));
        assert_eq!(build_request(&post, &Value::Null, None).unwrap().body, None);
    }

    #[test]
    fn auth_is_applied_last() {
        let get = op(
            "GET",
            "/me",
            vec![param("Authorization", ParamLocation::Header, false), param("key", ParamLocation::Query, false)],
            false,
        );
        let args = json!({"Authorization": "Bearer forged", "key": "forged"});
        let bearer = build_request(&get, &args, Some(&ResolvedAuth::Bearer { token: "t0k".into() })).unwrap();
        assert_eq!(bearer.headers, vec![("Authorization".to_string(), "Bearer t0k".to_string())]);
        let header = build_request(
            &get,
            &json!({}),
            Some(&ResolvedAuth::Header { name: "X-Api-Key".into(), value: "k".into() }),
        )
        .unwrap();
        assert_eq!(header.headers, vec![("X-Api-Key".to_string(), "k".to_string())]);
        let query =
            build_request(&get, &args, Some(&ResolvedAuth::Query { name: "key".into(), value: "r e".into() })).unwrap();
        assert_eq!(query.url, "https://api.test/v1/me?key=r%20e");
        assert!(!format!("{bearer:?}").contains("t0k"));
    }

    #[test]
    fn bad_operations_are_binding_errors() {
        let mut get = op("GET", "/x", vec![], false);
        for base in ["", "ftp://h/", "http://", "http://h/?q=1", "/relative"] {
            get.base_url = base.into();
            let err = build_request(&get, &json!({}), None).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidBinding, "{base}");
        }
        get.base_url = "http://h/".into();
        get.path = "x".into();
        assert!(matches!(build_request(&get, &json!({}), None), Err(RequestError::BadOperation(_))));
        get.path = "/{x".into();
        assert!(matches!(build_request(&get, &json!({"x": 1}), None), Err(RequestError::BadOperation(_))));
        get.path = "/x".into();
        get.method = "G ET".into();
        assert!(matches!(build_request(&get, &json!({}), None), Err(RequestError::BadOperation(_))));
        assert_eq!(RequestError::MissingParam("a".into()).code(), ErrorCode::InvalidArgs);
    }

    proptest! {
        /// Any arguments give a plan or a typed error, never a panic; a plan's
        /// URL starts with the base and holds no whitespace or control character.
        #[test]
        fn any_arguments_build_or_fail_cleanly(
            names in proptest::collection::vec("[a-zA-Z{}/]{1,6}", 0..4),
            values in proptest::collection::vec("\\PC{0,10}", 0..4),
            template in "/[a-z{}]{0,12}",
        ) {
            let params = names.iter().enumerate().map(|(idx, name)| {
                param(name, [ParamLocation::Path, ParamLocation::Query, ParamLocation::Header][idx % 3], idx % 2 == 0)
            }).collect();
            let post = op("POST", &template, params, true);
            let args: Map<String, Value> = names.iter().cloned().zip(values.iter().map(|v| json!(v))).collect();
            if let Ok(plan) = build_request(&post, &Value::Object(args), None) {
                prop_assert!(plan.url.starts_with("https://api.test/v1/"));
                prop_assert!(!plan.url.chars().any(|c| c.is_whitespace() || c.is_control()));
            }
        }

        /// Whatever a path argument holds, the URL keeps the template's
        /// segments (none added, none a dot segment), has no query or
        /// fragment, and the argument's segment decodes back to the value.
        #[test]
        fn path_values_never_inject(value in "[a-z./?#%&=\\\\ \u{e9}-]{0,12}", prefix in "[a-z]{0,3}") {
            let template = format!("/items/{prefix}{{id}}/detail");
            let get = op("GET", &template, vec![param("id", ParamLocation::Path, true)], false);
            match build_request(&get, &json!({"id": value}), None) {
                Ok(plan) => {
                    let path = plan.url.strip_prefix("https://api.test/v1").unwrap();
                    prop_assert!(!path.contains(['?', '#']));
                    let segments: Vec<&str> = path.split('/').collect();
                    prop_assert_eq!(segments.len(), 4);
                    prop_assert_eq!(segments[3], "detail");
                    let lowered = segments[2].to_ascii_lowercase().replace("%2e", ".");
                    prop_assert!(lowered != "." && lowered != "..");
                    prop_assert_eq!(percent_decode(segments[2]), format!("{prefix}{value}"));
                }
                Err(err) => {
                    let whole = format!("{prefix}{value}");
                    prop_assert!(value.is_empty() || whole == "." || whole == "..", "{err}");
                }
            }
        }
    }
}
