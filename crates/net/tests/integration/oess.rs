//! The OESS driver against a local HTTP server that replays the documented OESS responses.
//!
//! `OessStandIn` below is the one stand-in in this crate: it is not OESS. It accepts form POSTs
//! on 127.0.0.1, records each request, and answers with the response shapes that the OESS
//! documentation and `circuit.cgi` give (`{"success":1,"circuit_id":N}` for provision,
//! `{"results":[circuit]}` for get, `{"status":1}` for remove, and
//! `{"error":1,"error_text":…,"results":null}` for errors). The assertions check that the
//! requests the driver sends have the documented form: method, workgroup, times, and one JSON
//! `endpoint` per endpoint with node, interface, tag and bandwidth in Mbit/s.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use ldm7_net::path::oess::{OessApi, OessConfig, OessPaths};
use ldm7_net::{Endpoint, Leg, PathError, PathService, Rate};

/// One request the stand-in received.
#[derive(Debug, Clone)]
struct Recorded {
    path: String,
    authorization: String,
    fields: Vec<(String, String)>,
}

impl Recorded {
    fn get(&self, key: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn all(&self, key: &str) -> Vec<&str> {
        self.fields.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect()
    }

    fn endpoints(&self) -> Vec<serde_json::Value> {
        self.all("endpoint").iter().map(|e| serde_json::from_str(e).expect("endpoint is JSON")).collect()
    }
}

/// The stand-in for an OESS server (see the module doc). It keeps circuits in memory so that
/// `get` answers with what was provisioned, including `circuit_ep_id`s.
struct OessStandIn {
    base_url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl OessStandIn {
    fn start(fail_provision: bool) -> OessStandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base_url = format!("http://{}/oess/services-kerb", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&requests);
        std::thread::spawn(move || {
            let mut circuits: BTreeMap<u64, Vec<serde_json::Value>> = BTreeMap::new();
            let mut next_ep_id = 100u64;
            for stream in listener.incoming().take(64) {
                let Ok(mut stream) = stream else { break };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request_line = String::new();
                reader.read_line(&mut request_line).unwrap();
                let path = request_line.split_whitespace().nth(1).unwrap_or_default().to_string();
                let (mut length, mut authorization) = (0usize, String::new());
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    let (name, value) = line.split_once(':').unwrap_or_default();
                    match name.to_ascii_lowercase().as_str() {
                        "content-length" => length = value.trim().parse().unwrap(),
                        "authorization" => authorization = value.trim().to_string(),
                        _ => {}
                    }
                }
                let mut body = vec![0u8; length];
                reader.read_exact(&mut body).unwrap();
                let fields = parse_form(&String::from_utf8(body).unwrap());
                let request = Recorded { path, authorization, fields };
                let answer = respond(&request, &mut circuits, &mut next_ep_id, fail_provision);
                recorded.lock().unwrap().push(request);
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                stream.write_all(response.as_bytes()).unwrap();
            }
        });
        OessStandIn { base_url, requests }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

fn respond(
    request: &Recorded,
    circuits: &mut BTreeMap<u64, Vec<serde_json::Value>>,
    next_ep_id: &mut u64,
    fail_provision: bool,
) -> String {
    let error = |text: &str| serde_json::json!({"error": 1, "error_text": text, "results": null}).to_string();
    match request.get("method") {
        Some("provision") if fail_provision => error("Couldn't create Circuit: Cannot find a valid Interface for ."),
        Some("provision") => {
            let endpoints: Vec<serde_json::Value> = request
                .endpoints()
                .into_iter()
                .map(|mut ep| {
                    if ep.get("circuit_ep_id").is_none() {
                        ep["circuit_ep_id"] = (*next_ep_id).into();
                        *next_ep_id += 1;
                    }
                    ep
                })
                .collect();
            if endpoints.len() < 2 {
                return error("Couldn't create Circuit: Circuit requires at least two Endpoints.");
            }
            let id = match request.get("circuit_id") {
                Some(id) => id.parse().unwrap(),
                None => 4000 + circuits.len() as u64,
            };
            circuits.insert(id, endpoints);
            serde_json::json!({"success": 1, "circuit_id": id}).to_string()
        }
        Some("get") => {
            let id: u64 = request.get("circuit_id").unwrap().parse().unwrap();
            let endpoints: Vec<serde_json::Value> = circuits[&id]
                .iter()
                .map(|ep| {
                    serde_json::json!({
                        "node": ep["node"], "interface": ep["interface"], "tag": ep["tag"].to_string(),
                        "bandwidth": ep["bandwidth"], "circuit_ep_id": ep["circuit_ep_id"], "circuit_id": id,
                        "inner_tag": null, "mtu": 9000, "type": "circuit", "unit": ep["tag"],
                    })
                })
                .collect();
            serde_json::json!({"results": [{"circuit_id": id, "description": "ldm7", "state": "active", "endpoints": endpoints}]})
                .to_string()
        }
        Some("remove") => {
            circuits.remove(&request.get("circuit_id").unwrap().parse().unwrap());
            serde_json::json!({"status": 1}).to_string()
        }
        _ => error("unknown method"),
    }
}

fn parse_form(body: &str) -> Vec<(String, String)> {
    body.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).unwrap());
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

fn config(base_url: &str) -> OessConfig {
    OessConfig {
        base_url: base_url.to_string(),
        username: "ldm".into(),
        password: "secret".into(),
        workgroup_id: 42,
        api: OessApi::Circuit,
    }
}

fn leg(node: &str, interface: &str, tag: u16) -> Leg {
    Leg::plain(Endpoint { node: node.into(), interface: interface.into(), vlan_tag: Some(tag) })
}

#[test]
fn circuit_lifecycle_sends_the_documented_requests() {
    let server = OessStandIn::start(false);
    let mut paths = OessPaths::new(config(&server.base_url));
    paths.create_path("ngrid", Rate::from_megabits_per_s(40)).unwrap();
    paths.add_leg("ngrid", &leg("sdn-sw.denv.net.internet2.edu", "et-3/0/0", 332)).unwrap();
    assert!(server.requests().is_empty(), "one endpoint is not a circuit yet");
    paths.add_leg("ngrid", &leg("sdn-sw.ashb.net.internet2.edu", "et-8/0/0", 332)).unwrap();
    assert_eq!(paths.circuit_id("ngrid"), Some(4000));
    paths.add_leg("ngrid", &leg("sdn-sw.seat.net.internet2.edu", "et-1/1/0", 1201)).unwrap();
    paths.set_rate("ngrid", Rate::from_bits_per_s(100_500_000)).unwrap();
    paths.remove_leg("ngrid", &leg("sdn-sw.ashb.net.internet2.edu", "et-8/0/0", 332).endpoint).unwrap();
    let listed = paths.list().unwrap();
    assert_eq!(listed[0].legs.len(), 2);
    assert_eq!(listed[0].detail, "OESS circuit 4000");
    paths.remove_path("ngrid").unwrap();

    let requests = server.requests();
    let methods: Vec<&str> = requests.iter().map(|r| r.get("method").unwrap()).collect();
    assert_eq!(methods, ["provision", "get", "provision", "get", "provision", "get", "provision", "get", "remove"]);
    for request in &requests {
        assert_eq!(request.path, "/oess/services-kerb/circuit.cgi");
        assert_eq!(request.authorization, "Basic bGRtOnNlY3JldA==");
        assert_eq!(request.get("workgroup_id"), Some("42"));
    }

    // Create: the documented provision form, two JSON endpoints, no circuit_id.
    let create = &requests[0];
    assert_eq!(create.get("provision_time"), Some("-1"));
    assert_eq!(create.get("remove_time"), Some("-1"));
    assert_eq!(create.get("description"), Some("ldm7 ngrid"));
    assert_eq!(create.get("circuit_id"), None);
    assert_eq!(
        create.endpoints(),
        [
            serde_json::json!({"node": "sdn-sw.denv.net.internet2.edu", "interface": "et-3/0/0", "tag": 332, "bandwidth": 40}),
            serde_json::json!({"node": "sdn-sw.ashb.net.internet2.edu", "interface": "et-8/0/0", "tag": 332, "bandwidth": 40}),
        ]
    );
    // Adding a leg edits the circuit: existing endpoints keep their circuit_ep_id, the new one has none.
    let add = &requests[2];
    assert_eq!(add.get("circuit_id"), Some("4000"));
    let endpoints = add.endpoints();
    assert_eq!(endpoints.len(), 3);
    assert_eq!(endpoints[0]["circuit_ep_id"], 100);
    assert_eq!(endpoints[1]["circuit_ep_id"], 101);
    assert!(endpoints[2].get("circuit_ep_id").is_none());
    assert_eq!(endpoints[2]["tag"], 1201);
    // Changing the rate re-sends every endpoint with the new bandwidth, rounded up to Mbit/s.
    let rate = &requests[4];
    assert!(rate.endpoints().iter().all(|e| e["bandwidth"] == 101 && e.get("circuit_ep_id").is_some()));
    // Removing a leg re-sends the others only.
    let remove_leg = &requests[6];
    let nodes: Vec<String> = remove_leg.endpoints().iter().map(|e| e["node"].as_str().unwrap().to_string()).collect();
    assert_eq!(nodes, ["sdn-sw.denv.net.internet2.edu", "sdn-sw.seat.net.internet2.edu"]);
    // Removing the path removes the circuit.
    assert_eq!(requests[8].get("circuit_id"), Some("4000"));
}

#[test]
fn oess_errors_are_reported_with_their_text() {
    let server = OessStandIn::start(true);
    let mut paths = OessPaths::new(config(&server.base_url));
    paths.create_path("ngrid", Rate::from_megabits_per_s(40)).unwrap();
    paths.add_leg("ngrid", &leg("a", "1", 5)).unwrap();
    let error = paths.add_leg("ngrid", &leg("b", "2", 5)).unwrap_err();
    assert!(matches!(error, PathError::Oess(_)), "{error}");
    assert!(error.to_string().contains("Cannot find a valid Interface"), "{error}");
    assert_eq!(paths.list().unwrap()[0].legs.len(), 1, "the failed leg is not recorded");
}

#[test]
fn unreachable_oess_says_where_it_tried() {
    let mut paths = OessPaths::new(config("http://127.0.0.1:9/oess"));
    paths.create_path("ngrid", Rate::from_megabits_per_s(40)).unwrap();
    paths.add_leg("ngrid", &leg("a", "1", 5)).unwrap();
    let error = paths.add_leg("ngrid", &leg("b", "2", 5)).unwrap_err().to_string();
    assert!(error.contains("cannot reach http://127.0.0.1:9/oess/circuit.cgi"), "{error}");
}
