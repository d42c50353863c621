//! The `linux-bridge` driver: one Linux bridge per feed (`br-FEED`), legs are existing ports
//! (veth ends) attached to it and detached from it — a real dynamic multipoint L2 path on one
//! host. Multicast snooping is off, so the bridge floods multicast like an AL2S VLAN does.
//!
//! The driver keeps no state of its own: the path rate is stored in the bridge's interface alias
//! (`ldm7 path rate=BITS`), so `list` works from any process. The rate is bookkeeping here; the
//! publisher's HTB tree ([`crate::tc`]) is what holds traffic to it.

use super::{Endpoint, Leg, PathError, PathInfo, PathService};
use crate::command::Cmd;
use ldm7_types::units::Rate;

const ALIAS_PREFIX: &str = "ldm7 path rate=";
/// Longest path name: the bridge `br-NAME` must fit Linux's 15-byte interface names.
const NAME_LEN_MAX: usize = 12;

/// Bridges in one network namespace (`None` = the current one).
#[derive(Debug, Clone)]
pub struct BridgePaths {
    netns: Option<String>,
}

impl BridgePaths {
    /// A driver that keeps its bridges in namespace `netns`.
    pub fn new(netns: Option<&str>) -> BridgePaths {
        BridgePaths { netns: netns.map(str::to_string) }
    }

    /// The bridge device of path `name`.
    pub fn bridge_name(name: &str) -> String {
        format!("br-{name}")
    }

    fn ip(&self) -> Cmd {
        Cmd::new("ip").netns(self.netns.as_deref())
    }

    fn rate_of(&self, name: &str) -> Result<Rate, PathError> {
        let text = self
            .ip()
            .args(["-j", "link", "show", "dev", &Self::bridge_name(name)])
            .run()
            .map_err(|_| PathError::NoSuchPath(name.to_string()))?;
        let links: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
        links
            .first()
            .and_then(|l| l["ifalias"].as_str())
            .and_then(|alias| alias.strip_prefix(ALIAS_PREFIX))
            .and_then(|bits| bits.parse().ok())
            .map(Rate::from_bits_per_s)
            .ok_or_else(|| PathError::NotOurs { bridge: Self::bridge_name(name) })
    }

    fn ports(&self, name: &str) -> Result<Vec<String>, PathError> {
        let text = self.ip().args(["-j", "link", "show", "master", &Self::bridge_name(name)]).run()?;
        let links: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
        Ok(links.iter().filter_map(|l| l["ifname"].as_str().map(str::to_string)).collect())
    }
}

impl PathService for BridgePaths {
    fn driver(&self) -> &'static str {
        "linux-bridge"
    }

    fn create_path(&mut self, name: &str, rate: Rate) -> Result<(), PathError> {
        if name.len() > NAME_LEN_MAX || name.is_empty() {
            return Err(PathError::BadName { name: name.to_string(), max_len: NAME_LEN_MAX });
        }
        let bridge = Self::bridge_name(name);
        if self.ip().args(["link", "show", "dev", &bridge]).run().is_ok() {
            return Err(PathError::PathExists(name.to_string()));
        }
        self.ip().args(["link", "add", &bridge, "type", "bridge", "mcast_snooping", "0"]).run()?;
        self.ip()
            .args(["link", "set", "dev", &bridge, "alias", &format!("{ALIAS_PREFIX}{}", rate.bits_per_s())])
            .run()?;
        self.ip().args(["link", "set", "dev", &bridge, "up"]).run()?;
        Ok(())
    }

    fn add_leg(&mut self, name: &str, leg: &Leg) -> Result<(), PathError> {
        if leg.is_impaired() {
            return Err(PathError::ImpairmentUnsupported { driver: self.driver(), endpoint: leg.endpoint.clone() });
        }
        self.rate_of(name)?;
        let port = &leg.endpoint.interface;
        self.ip().args(["link", "set", "dev", port, "master", &Self::bridge_name(name)]).run()?;
        self.ip().args(["link", "set", "dev", port, "up"]).run()?;
        Ok(())
    }

    fn remove_leg(&mut self, name: &str, endpoint: &Endpoint) -> Result<(), PathError> {
        if !self.ports(name)?.contains(&endpoint.interface) {
            return Err(PathError::NoSuchLeg { path: name.to_string(), endpoint: endpoint.clone() });
        }
        self.ip().args(["link", "set", "dev", &endpoint.interface, "nomaster"]).run()?;
        Ok(())
    }

    fn set_rate(&mut self, name: &str, rate: Rate) -> Result<(), PathError> {
        self.rate_of(name)?;
        let bridge = Self::bridge_name(name);
        self.ip()
            .args(["link", "set", "dev", &bridge, "alias", &format!("{ALIAS_PREFIX}{}", rate.bits_per_s())])
            .run()?;
        Ok(())
    }

    fn list(&mut self) -> Result<Vec<PathInfo>, PathError> {
        let text = self.ip().args(["-j", "link", "show", "type", "bridge"]).run()?;
        let links: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
        let mut paths = Vec::new();
        for link in links {
            let (Some(bridge), Some(alias)) = (link["ifname"].as_str(), link["ifalias"].as_str()) else { continue };
            let (Some(name), Some(bits)) = (bridge.strip_prefix("br-"), alias.strip_prefix(ALIAS_PREFIX)) else {
                continue;
            };
            let legs =
                self.ports(name)?.iter().map(|port| Endpoint::new(self.netns.as_deref().unwrap_or(""), port)).collect();
            paths.push(PathInfo {
                name: name.to_string(),
                rate: Rate::from_bits_per_s(bits.parse().unwrap_or(0)),
                legs,
                detail: format!("bridge {bridge}"),
            });
        }
        Ok(paths)
    }

    fn remove_path(&mut self, name: &str) -> Result<(), PathError> {
        match self.rate_of(name) {
            Err(PathError::NoSuchPath(_)) => return Ok(()),
            Err(other) => return Err(other),
            Ok(_) => {}
        }
        self.ip().args(["link", "del", "dev", &Self::bridge_name(name)]).run()?;
        Ok(())
    }
}
