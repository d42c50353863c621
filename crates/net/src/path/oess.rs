//! The `oess` driver: Internet2 AL2S multipoint circuits through the OESS web services.
//!
//! Formats follow the OESS API documentation (GlobalNOC OESS `docs/`, "Request format" and
//! "Response format"; `circuit.cgi` methods `provision`, `get`, `remove`; the deprecated
//! `provisioning.cgi` methods `provision_circuit` / `remove_circuit` that LDM 7's
//! `OESS-Client-V2/provision.py` used):
//! - requests are `application/x-www-form-urlencoded` POSTs; the method is the `method`
//!   parameter; list-valued parameters repeat (`endpoint=…&endpoint=…`);
//! - `circuit.cgi?method=provision` takes `workgroup_id`, `description`, `provision_time=-1`
//!   (now), `remove_time=-1` (never), and one `endpoint` per endpoint, each a JSON object
//!   `{"node", "interface", "tag", "bandwidth"}` (bandwidth in Mbit/s; tag −1 = untagged). With
//!   `circuit_id` it edits that circuit: endpoints carrying their `circuit_ep_id` are kept (and
//!   updated), new ones are added, and the ones left out are removed;
//! - responses are JSON objects; on error `error` is set and `error_text` explains; provision
//!   answers `{"success": 1, "circuit_id": N}`, remove `{"status": 1}`, get `{"results": [...]}`.
//!
//! OESS needs at least two endpoints for a circuit, so the circuit is provisioned when the second
//! leg is added, edited as legs come and go, and removed when fewer than two remain. Every
//! endpoint reserves the path rate (rounded up to whole Mbit/s).

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Endpoint, Leg, PathError, PathInfo, PathService};
use ldm7_types::units::Rate;

/// Which OESS web-service dialect to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OessApi {
    /// `circuit.cgi` (`provision` / `get` / `remove`), the current interface.
    Circuit,
    /// `provisioning.cgi` (`provision_circuit` / `remove_circuit`), deprecated, as used by LDM 7.
    Provisioning,
}

/// How to reach an OESS instance.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OessConfig {
    /// The services URL, e.g. `https://al2s.example.net/oess/services-kerb` (no trailing `/`).
    pub base_url: String,
    /// HTTP Basic user name.
    pub username: String,
    /// HTTP Basic password.
    pub password: String,
    /// The OESS workgroup that owns the circuits.
    pub workgroup_id: u64,
    /// The dialect.
    pub api: OessApi,
}

/// A form request: which CGI and the (repeatable) fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OessRequest {
    /// `circuit.cgi` or `provisioning.cgi`.
    pub cgi: &'static str,
    /// The form fields in order.
    pub fields: Vec<(String, String)>,
}

/// One endpoint of a circuit as OESS knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitEndpoint {
    /// Node, interface and tag.
    pub endpoint: Endpoint,
    /// OESS's id of this endpoint on the circuit, once provisioned.
    pub circuit_ep_id: Option<u64>,
}

/// Builds a provision (create when `circuit_id` is `None`, else edit) request.
pub fn provision_request(
    api: OessApi,
    workgroup_id: u64,
    description: &str,
    circuit_id: Option<u64>,
    endpoints: &[CircuitEndpoint],
    rate: Rate,
) -> OessRequest {
    let bandwidth_mbps = rate.megabits_per_s_ceil();
    let mut fields = vec![
        field("method", if api == OessApi::Circuit { "provision" } else { "provision_circuit" }),
        field("workgroup_id", &workgroup_id.to_string()),
        field("description", description),
        field("provision_time", "-1"),
        field("remove_time", "-1"),
    ];
    if let Some(id) = circuit_id {
        fields.push(field("circuit_id", &id.to_string()));
    }
    match api {
        OessApi::Circuit => {
            for ep in endpoints {
                let mut json = serde_json::json!({
                    "node": ep.endpoint.node,
                    "interface": ep.endpoint.interface,
                    "tag": tag_of(&ep.endpoint),
                    "bandwidth": bandwidth_mbps,
                });
                if let Some(id) = ep.circuit_ep_id {
                    json["circuit_ep_id"] = id.into();
                }
                fields.push(field("endpoint", &json.to_string()));
            }
            OessRequest { cgi: "circuit.cgi", fields }
        }
        OessApi::Provisioning => {
            fields.push(field("bandwidth", &bandwidth_mbps.to_string()));
            for ep in endpoints {
                fields.push(field("node", &ep.endpoint.node));
            }
            for ep in endpoints {
                fields.push(field("interface", &ep.endpoint.interface));
            }
            for ep in endpoints {
                fields.push(field("tag", &tag_of(&ep.endpoint).to_string()));
            }
            OessRequest { cgi: "provisioning.cgi", fields }
        }
    }
}

/// Builds a remove request for circuit `circuit_id`.
pub fn remove_request(api: OessApi, workgroup_id: u64, circuit_id: u64) -> OessRequest {
    match api {
        OessApi::Circuit => OessRequest {
            cgi: "circuit.cgi",
            fields: vec![
                field("method", "remove"),
                field("workgroup_id", &workgroup_id.to_string()),
                field("circuit_id", &circuit_id.to_string()),
            ],
        },
        OessApi::Provisioning => OessRequest {
            cgi: "provisioning.cgi",
            fields: vec![
                field("method", "remove_circuit"),
                field("workgroup_id", &workgroup_id.to_string()),
                field("circuit_id", &circuit_id.to_string()),
                field("remove_time", "-1"),
            ],
        },
    }
}

/// Builds a `circuit.cgi?method=get` request for circuit `circuit_id`.
pub fn get_request(workgroup_id: u64, circuit_id: u64) -> OessRequest {
    OessRequest {
        cgi: "circuit.cgi",
        fields: vec![
            field("method", "get"),
            field("workgroup_id", &workgroup_id.to_string()),
            field("circuit_id", &circuit_id.to_string()),
        ],
    }
}

/// Why talking to OESS failed.
#[derive(Debug, thiserror::Error)]
pub enum OessError {
    /// The answer is not JSON (a login page, a proxy error …).
    #[error(
        "OESS answered something that is not JSON ({source}): {body_start}; check that base_url names the \
         OESS services directory"
    )]
    NotJson {
        /// The first 200 characters of the answer.
        body_start: String,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// OESS refused the request (`"error": 1`).
    #[error("{error_text}")]
    Refused {
        /// OESS's `error_text`.
        error_text: String,
    },
    /// The answer lacks what the request must return.
    #[error("the {method} answer lacks {missing}: {body_start}; is base_url an OESS services directory?")]
    Incomplete {
        /// The request method.
        method: &'static str,
        /// What is missing.
        missing: &'static str,
        /// The first 200 characters of the answer.
        body_start: String,
    },
    /// The web server answered with an HTTP error status.
    #[error("{url} answered HTTP {status}: {body_start}; check base_url, credentials and workgroup")]
    Http {
        /// Where the request went.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The first 300 characters of the answer.
        body_start: String,
    },
    /// No answer at all.
    #[error("cannot reach {url}: {source}; check base_url and that the host is reachable")]
    Unreachable {
        /// Where the request went.
        url: String,
        /// The transport error.
        source: Box<ureq::Transport>,
    },
    /// The answer could not be read.
    #[error("reading the answer of {url}: {source}")]
    Read {
        /// Where the request went.
        url: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The circuit id from a provision response, or why there is none.
pub fn parse_provision_response(body: &str) -> Result<u64, OessError> {
    let value = parse_response(body)?;
    let results = &value["results"];
    let ok = truthy(&value["success"]) || truthy(&value["status"]) || truthy(&results["success"]);
    let id = number(&value["circuit_id"]).or_else(|| number(&results["circuit_id"]));
    match (ok, id) {
        (true, Some(id)) => Ok(id),
        _ => Err(OessError::Incomplete {
            method: "provision",
            missing: "success and circuit_id",
            body_start: start(body, 200),
        }),
    }
}

/// Success of a remove response, or why not.
pub fn parse_remove_response(body: &str) -> Result<(), OessError> {
    let value = parse_response(body)?;
    if truthy(&value["status"]) || truthy(&value["success"]) || truthy(&value["results"]["success"]) {
        Ok(())
    } else {
        Err(OessError::Incomplete { method: "remove", missing: "status or success", body_start: start(body, 200) })
    }
}

/// The endpoints of the circuit in a `get` response.
pub fn parse_get_response(body: &str) -> Result<Vec<CircuitEndpoint>, OessError> {
    let value = parse_response(body)?;
    let incomplete = |missing| OessError::Incomplete { method: "get", missing, body_start: start(body, 200) };
    let circuit = value["results"].get(0).ok_or_else(|| incomplete("a circuit in results"))?;
    let endpoints = circuit["endpoints"].as_array().ok_or_else(|| incomplete("the circuit's endpoints"))?;
    Ok(endpoints
        .iter()
        .map(|ep| CircuitEndpoint {
            endpoint: Endpoint {
                node: ep["node"].as_str().unwrap_or_default().to_string(),
                interface: ep["interface"].as_str().unwrap_or_default().to_string(),
                vlan_tag: number(&ep["tag"]).and_then(|t| u16::try_from(t).ok()),
            },
            circuit_ep_id: number(&ep["circuit_ep_id"]),
        })
        .collect())
}

/// Multipoint circuits on an OESS instance, one per feed.
#[derive(Debug)]
pub struct OessPaths {
    config: OessConfig,
    agent: ureq::Agent,
    paths: BTreeMap<String, OessPath>,
}

#[derive(Debug, Clone)]
struct OessPath {
    rate: Rate,
    circuit_id: Option<u64>,
    endpoints: Vec<CircuitEndpoint>,
}

impl OessPaths {
    /// A client for the OESS instance in `config`.
    pub fn new(config: OessConfig) -> OessPaths {
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
        OessPaths { config, agent, paths: BTreeMap::new() }
    }

    /// Takes over existing circuit `circuit_id` as the path of feed `name` (reads its endpoints).
    pub fn adopt(&mut self, name: &str, rate: Rate, circuit_id: u64) -> Result<(), PathError> {
        let body = self.call(&get_request(self.config.workgroup_id, circuit_id))?;
        let endpoints = parse_get_response(&body)?;
        self.paths.insert(name.to_string(), OessPath { rate, circuit_id: Some(circuit_id), endpoints });
        Ok(())
    }

    /// The OESS circuit id of path `name`, once provisioned.
    pub fn circuit_id(&self, name: &str) -> Option<u64> {
        self.paths.get(name).and_then(|p| p.circuit_id)
    }

    fn call(&self, request: &OessRequest) -> Result<String, PathError> {
        let url = format!("{}/{}", self.config.base_url.trim_end_matches('/'), request.cgi);
        let fields: Vec<(&str, &str)> = request.fields.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let credentials = base64(format!("{}:{}", self.config.username, self.config.password).as_bytes());
        let response = self.agent.post(&url).set("Authorization", &format!("Basic {credentials}")).send_form(&fields);
        let body = match response {
            Ok(response) => response.into_string().map_err(|source| OessError::Read { url: url.clone(), source })?,
            Err(ureq::Error::Status(status, response)) => {
                let body_start = start(&response.into_string().unwrap_or_default(), 300);
                return Err(OessError::Http { url, status, body_start }.into());
            }
            Err(ureq::Error::Transport(transport)) => {
                return Err(OessError::Unreachable { url, source: Box::new(transport) }.into());
            }
        };
        Ok(body)
    }

    /// Provisions, edits or removes the circuit so that it matches the path's legs.
    fn sync(&mut self, name: &str) -> Result<(), PathError> {
        let path = self.paths.get(name).cloned().ok_or_else(|| PathError::NoSuchPath(name.to_string()))?;
        let workgroup_id = self.config.workgroup_id;
        let description = format!("ldm7 {name}");
        if path.endpoints.len() < 2 {
            if let Some(circuit_id) = path.circuit_id {
                let body = self.call(&remove_request(self.config.api, workgroup_id, circuit_id))?;
                parse_remove_response(&body)?;
                if let Some(p) = self.paths.get_mut(name) {
                    p.circuit_id = None;
                    p.endpoints.iter_mut().for_each(|e| e.circuit_ep_id = None);
                }
            }
            return Ok(());
        }
        let request =
            provision_request(self.config.api, workgroup_id, &description, path.circuit_id, &path.endpoints, path.rate);
        let body = self.call(&request)?;
        let circuit_id = parse_provision_response(&body)?;
        let endpoints = if self.config.api == OessApi::Circuit {
            let body = self.call(&get_request(workgroup_id, circuit_id))?;
            parse_get_response(&body)?
        } else {
            path.endpoints.clone()
        };
        if let Some(p) = self.paths.get_mut(name) {
            p.circuit_id = Some(circuit_id);
            for ep in &mut p.endpoints {
                ep.circuit_ep_id =
                    endpoints.iter().find(|e| same_endpoint(&e.endpoint, &ep.endpoint)).and_then(|e| e.circuit_ep_id);
            }
        }
        Ok(())
    }
}

impl PathService for OessPaths {
    fn driver(&self) -> &'static str {
        "oess"
    }

    fn create_path(&mut self, name: &str, rate: Rate) -> Result<(), PathError> {
        if self.paths.contains_key(name) {
            return Err(PathError::PathExists(name.to_string()));
        }
        self.paths.insert(name.to_string(), OessPath { rate, circuit_id: None, endpoints: Vec::new() });
        Ok(())
    }

    fn add_leg(&mut self, name: &str, leg: &Leg) -> Result<(), PathError> {
        if leg.is_impaired() {
            return Err(PathError::ImpairmentUnsupported { driver: self.driver(), endpoint: leg.endpoint.clone() });
        }
        let path = self.paths.get_mut(name).ok_or_else(|| PathError::NoSuchPath(name.to_string()))?;
        if path.endpoints.iter().any(|e| same_endpoint(&e.endpoint, &leg.endpoint)) {
            return Ok(());
        }
        path.endpoints.push(CircuitEndpoint { endpoint: leg.endpoint.clone(), circuit_ep_id: None });
        if let Err(error) = self.sync(name) {
            if let Some(path) = self.paths.get_mut(name) {
                path.endpoints.retain(|e| !same_endpoint(&e.endpoint, &leg.endpoint));
            }
            return Err(error);
        }
        Ok(())
    }

    fn remove_leg(&mut self, name: &str, endpoint: &Endpoint) -> Result<(), PathError> {
        let path = self.paths.get_mut(name).ok_or_else(|| PathError::NoSuchPath(name.to_string()))?;
        let Some(index) = path.endpoints.iter().position(|e| same_endpoint(&e.endpoint, endpoint)) else {
            return Err(PathError::NoSuchLeg { path: name.to_string(), endpoint: endpoint.clone() });
        };
        let removed = path.endpoints.remove(index);
        if let Err(error) = self.sync(name) {
            if let Some(path) = self.paths.get_mut(name) {
                path.endpoints.insert(index, removed);
            }
            return Err(error);
        }
        Ok(())
    }

    fn set_rate(&mut self, name: &str, rate: Rate) -> Result<(), PathError> {
        let path = self.paths.get_mut(name).ok_or_else(|| PathError::NoSuchPath(name.to_string()))?;
        let previous = std::mem::replace(&mut path.rate, rate);
        if let Err(error) = self.sync(name) {
            if let Some(path) = self.paths.get_mut(name) {
                path.rate = previous;
            }
            return Err(error);
        }
        Ok(())
    }

    fn list(&mut self) -> Result<Vec<PathInfo>, PathError> {
        Ok(self
            .paths
            .iter()
            .map(|(name, path)| PathInfo {
                name: name.clone(),
                rate: path.rate,
                legs: path.endpoints.iter().map(|e| e.endpoint.clone()).collect(),
                detail: match path.circuit_id {
                    Some(id) => format!("OESS circuit {id}"),
                    None => "OESS circuit not provisioned yet (needs two endpoints)".to_string(),
                },
            })
            .collect())
    }

    fn remove_path(&mut self, name: &str) -> Result<(), PathError> {
        if let Some(path) = self.paths.get_mut(name) {
            path.endpoints.clear();
            self.sync(name)?;
            self.paths.remove(name);
        }
        Ok(())
    }
}

fn same_endpoint(a: &Endpoint, b: &Endpoint) -> bool {
    a.node == b.node && a.interface == b.interface && a.vlan_tag.unwrap_or(u16::MAX) == b.vlan_tag.unwrap_or(u16::MAX)
}

fn tag_of(endpoint: &Endpoint) -> i64 {
    endpoint.vlan_tag.map_or(-1, i64::from)
}

fn field(key: &str, value: &str) -> (String, String) {
    (key.to_string(), value.to_string())
}

fn parse_response(body: &str) -> Result<serde_json::Value, OessError> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|source| OessError::NotJson { body_start: start(body, 200), source })?;
    if truthy(&value["error"]) {
        let error_text = value["error_text"].as_str().unwrap_or("OESS reported an error without error_text");
        return Err(OessError::Refused { error_text: error_text.to_string() });
    }
    Ok(value)
}

/// The first `chars` characters of `text`, for messages.
fn start(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

/// OESS booleans are 0/1 as numbers or strings.
fn truthy(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Bool(b) => *b,
        serde_json::Value::Number(n) => n.as_i64().is_some_and(|n| n != 0),
        serde_json::Value::String(s) => s == "1" || s == "true",
        _ => false,
    }
}

/// OESS numbers are sometimes strings.
fn number(value: &serde_json::Value) -> Option<u64> {
    match value {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(node: &str, interface: &str, tag: u16, id: Option<u64>) -> CircuitEndpoint {
        CircuitEndpoint {
            endpoint: Endpoint { node: node.into(), interface: interface.into(), vlan_tag: Some(tag) },
            circuit_ep_id: id,
        }
    }

    #[test]
    fn circuit_provision_has_one_json_endpoint_per_leg() {
        let request = provision_request(
            OessApi::Circuit,
            42,
            "ldm7 ngrid",
            None,
            &[ep("sdn-sw.ashb", "et-3/0/0", 332, None), ep("sdn-sw.pitt", "et-8/0/0", 332, None)],
            Rate::from_megabits_per_s(40),
        );
        assert_eq!(request.cgi, "circuit.cgi");
        let keys: Vec<&str> = request.fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["method", "workgroup_id", "description", "provision_time", "remove_time", "endpoint", "endpoint"]
        );
        assert_eq!(request.fields[0].1, "provision");
        let first: serde_json::Value = serde_json::from_str(&request.fields[5].1).unwrap();
        assert_eq!(
            first,
            serde_json::json!({"node": "sdn-sw.ashb", "interface": "et-3/0/0", "tag": 332, "bandwidth": 40})
        );
    }

    #[test]
    fn circuit_edit_keeps_endpoint_ids() {
        let request = provision_request(
            OessApi::Circuit,
            42,
            "ldm7 ngrid",
            Some(7),
            &[ep("a", "1", 5, Some(100)), ep("b", "2", 5, None)],
            Rate::from_bits_per_s(20_500_000),
        );
        assert!(request.fields.contains(&field("circuit_id", "7")));
        let first: serde_json::Value = serde_json::from_str(&request.fields[6].1).unwrap();
        assert_eq!(first["circuit_ep_id"], 100);
        assert_eq!(first["bandwidth"], 21);
    }

    #[test]
    fn legacy_provision_uses_parallel_arrays() {
        let request = provision_request(
            OessApi::Provisioning,
            42,
            "ldm7 ngrid",
            None,
            &[ep("a", "1", 5, None), ep("b", "2", 6, None)],
            Rate::from_megabits_per_s(40),
        );
        assert_eq!(request.cgi, "provisioning.cgi");
        let text: Vec<String> = request.fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            text,
            [
                "method=provision_circuit",
                "workgroup_id=42",
                "description=ldm7 ngrid",
                "provision_time=-1",
                "remove_time=-1",
                "bandwidth=40",
                "node=a",
                "node=b",
                "interface=1",
                "interface=2",
                "tag=5",
                "tag=6",
            ]
        );
        let remove = remove_request(OessApi::Provisioning, 42, 9);
        assert_eq!(remove.fields.last().unwrap(), &field("remove_time", "-1"));
    }

    #[test]
    fn responses_parse_including_errors() {
        assert_eq!(parse_provision_response(r#"{"success":1,"circuit_id":123}"#).unwrap(), 123);
        assert_eq!(parse_provision_response(r#"{"results":{"success":1,"circuit_id":"4567"}}"#).unwrap(), 4567);
        let refused = parse_provision_response(
            r#"{"error_text":"Couldn't create Circuit: Circuit requires at least two Endpoints.","error":1,"results":null}"#,
        )
        .unwrap_err();
        assert!(
            matches!(&refused, OessError::Refused { error_text } if error_text == "Couldn't create Circuit: Circuit requires at least two Endpoints."),
            "{refused}"
        );
        assert!(matches!(parse_provision_response(r#"{"success":1}"#), Err(OessError::Incomplete { .. })));
        assert!(parse_remove_response(r#"{"status":1}"#).is_ok());
        assert!(matches!(parse_remove_response("<html>"), Err(OessError::NotJson { .. })));
        let endpoints = parse_get_response(
            r#"{"results":[{"circuit_id":7,"endpoints":[{"node":"a","interface":"1","tag":"5","circuit_ep_id":100}]}]}"#,
        )
        .unwrap();
        assert_eq!(endpoints, vec![ep("a", "1", 5, Some(100))]);
    }

    #[test]
    fn basic_auth_encoding() {
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"a"), "YQ==");
    }
}
