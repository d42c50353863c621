//! Host configuration for a feed: the feed interface, its private address, the multicast route,
//! receive-side loss, and (at the publisher) the HTB tree of [`crate::tc`]; and the plain bridge
//! and veth plumbing of the lab's control network.
//!
//! On a real host the feed interface is an 802.1Q interface on the NIC facing the multipoint
//! path (`ip link add link eth1 name eth1.332 type vlan id 332`); this kernel has no 802.1Q
//! module, so the lab uses a veth leg (bridge paths) or a persistent TAP device (VDE paths).
//! Every function takes the namespace to work in (`None` = the current one) and fails with a
//! [`CommandError`] naming the command, except the address functions a subscriber uses on its
//! own feed interface ([`addresses`], [`ensure_address`], [`remove_address`]), which fail with an
//! [`AddressError`] and are idempotent: calling them again, or racing another caller, is not an
//! error.

use std::net::Ipv4Addr;

use crate::command::{Cmd, CommandError};
use ldm7_types::units::LossPercent;

/// An IPv4 address with its prefix length, e.g. `10.77.1.2/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ipv4Cidr {
    /// The address.
    pub address: Ipv4Addr,
    /// The prefix length, 0–32.
    pub prefix_len: u8,
}

impl std::fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix_len)
    }
}

/// Text that is not an IPv4 prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an IPv4 prefix; write an address, a slash and a length of 0–32, such as \"10.77.1.0/24\"")]
pub struct CidrError {
    /// The text given.
    pub text: String,
}

impl std::str::FromStr for Ipv4Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Ipv4Cidr, CidrError> {
        let bad = || CidrError { text: text.to_string() };
        let (address, prefix) = text.trim().split_once('/').ok_or_else(bad)?;
        let address: Ipv4Addr = address.parse().map_err(|_| bad())?;
        let prefix_len: u8 = prefix.parse().map_err(|_| bad())?;
        if prefix_len > 32 {
            return Err(bad());
        }
        Ok(Ipv4Cidr { address, prefix_len })
    }
}

impl Ipv4Cidr {
    /// The network address (host bits cleared).
    pub fn network(self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.address) & self.mask())
    }

    /// The broadcast address.
    pub fn broadcast(self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.address) | !self.mask())
    }

    /// The `n`th address of the network (0 = network address), if it is inside it.
    pub fn nth(self, n: u32) -> Option<Ipv4Addr> {
        let size = if self.prefix_len == 0 { u32::MAX } else { (1u32 << (32 - self.prefix_len)) - 1 };
        (n <= size).then(|| Ipv4Addr::from(u32::from(self.network()) + n))
    }

    fn mask(self) -> u32 {
        if self.prefix_len == 0 { 0 } else { u32::MAX << (32 - self.prefix_len) }
    }
}

/// Why a feed interface's addresses could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// The interface does not exist.
    #[error("interface {dev:?} does not exist in {}; check the name (in a lab host: the feed's name, and is the lab up?)", netns_text(.netns))]
    NoSuchInterface {
        /// The namespace looked in (`None` = the current one).
        netns: Option<String>,
        /// The interface.
        dev: String,
    },
    /// The address is the network or broadcast address of its own prefix.
    #[error("{cidr} is the network or broadcast address of {network}/{prefix_len}; give a host address of it", network = .cidr.network(), prefix_len = .cidr.prefix_len)]
    NotAHostAddress {
        /// The address given.
        cidr: Ipv4Cidr,
    },
    /// `ip` printed something that is not its JSON address list.
    #[error("`{command}` printed no address list ({problem}); is iproute2 older than 4.14 (no -j)?")]
    Unreadable {
        /// The command.
        command: String,
        /// What was wrong with its output.
        problem: String,
    },
    /// `ip` failed otherwise.
    #[error(transparent)]
    Command(#[from] CommandError),
}

/// The IPv4 addresses of interface `dev`, in the kernel's order.
pub fn addresses(netns: Option<&str>, dev: &str) -> Result<Vec<Ipv4Cidr>, AddressError> {
    let command = Cmd::new("ip").netns(netns).args(["-j", "-4", "addr", "show", "dev", dev]);
    let text = command.run().map_err(|error| address_error(error, netns, dev))?;
    parse_addresses(&text).map_err(|problem| AddressError::Unreadable { command: command.to_string(), problem })
}

/// The global IPv6 addresses of interface `dev` (link-local ones left out), in the kernel's
/// order.
pub fn addresses6(netns: Option<&str>, dev: &str) -> Result<Vec<ipnet::Ipv6Net>, AddressError> {
    let command = Cmd::new("ip").netns(netns).args(["-j", "-6", "addr", "show", "dev", dev, "scope", "global"]);
    let text = command.run().map_err(|error| address_error(error, netns, dev))?;
    parse_addresses6(&text).map_err(|problem| AddressError::Unreadable { command: command.to_string(), problem })
}

/// Gives interface `dev` IPv6 address `net` (without duplicate address detection: the
/// publisher's pool makes it unique) unless it has it already. Returns true when it added it.
pub fn ensure_address6(netns: Option<&str>, dev: &str, net: ipnet::Ipv6Net) -> Result<bool, AddressError> {
    if addresses6(netns, dev)?.contains(&net) {
        return Ok(false);
    }
    match Cmd::new("ip").netns(netns).args(["-6", "addr", "add", &net.to_string(), "dev", dev, "nodad"]).run() {
        Ok(_) => Ok(true),
        Err(error) if error.stderr().contains("File exists") => Ok(false),
        Err(error) => Err(address_error(error, netns, dev)),
    }
}

/// Removes IPv6 address `net` from interface `dev`. Returns true when it removed it.
pub fn remove_address6(netns: Option<&str>, dev: &str, net: ipnet::Ipv6Net) -> Result<bool, AddressError> {
    if !addresses6(netns, dev)?.contains(&net) {
        return Ok(false);
    }
    match Cmd::new("ip").netns(netns).args(["-6", "addr", "del", &net.to_string(), "dev", dev]).run() {
        Ok(_) => Ok(true),
        Err(error) if error.stderr().contains("Cannot assign") => Ok(false),
        Err(error) => Err(address_error(error, netns, dev)),
    }
}

/// The IPv6 addresses in the output of `ip -j -6 addr show dev DEV`.
fn parse_addresses6(text: &str) -> Result<Vec<ipnet::Ipv6Net>, String> {
    let links: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|error| error.to_string())?;
    let mut found = Vec::new();
    for info in links.iter().filter_map(|l| l["addr_info"].as_array()).flatten() {
        if info["family"] != "inet6" {
            continue;
        }
        let address = info["local"].as_str().and_then(|a| a.parse::<std::net::Ipv6Addr>().ok());
        let prefix_len = info["prefixlen"].as_u64().and_then(|p| u8::try_from(p).ok());
        match (address, prefix_len.and_then(|p| address.and_then(|a| ipnet::Ipv6Net::new(a, p).ok()))) {
            (Some(_), Some(net)) => found.push(net),
            _ => return Err(format!("an address entry without local and prefixlen: {info}")),
        }
    }
    Ok(found)
}

/// The interface holding IPv4 address `address` in namespace `netns`, if any.
pub fn interface_with_address(netns: Option<&str>, address: Ipv4Addr) -> Result<Option<String>, AddressError> {
    let command = Cmd::new("ip").netns(netns).args(["-j", "-4", "addr", "show"]);
    let text = command.run()?;
    interface_in(&text, address).map_err(|problem| AddressError::Unreadable { command: command.to_string(), problem })
}

/// Gives interface `dev` address `cidr` unless it has exactly that address and prefix already.
/// Returns true when it added the address. Other addresses of `dev` are left alone.
pub fn ensure_address(netns: Option<&str>, dev: &str, cidr: Ipv4Cidr) -> Result<bool, AddressError> {
    check_host_address(cidr)?;
    if addresses(netns, dev)?.contains(&cidr) {
        return Ok(false);
    }
    match Cmd::new("ip").netns(netns).args(["addr", "add", &cidr.to_string(), "dev", dev]).run() {
        Ok(_) => Ok(true),
        // Added by someone else since the look above.
        Err(error) if error.stderr().contains("already assigned") || error.stderr().contains("File exists") => {
            Ok(false)
        }
        Err(error) => Err(address_error(error, netns, dev)),
    }
}

/// Removes address `cidr` (exactly that address and prefix) from interface `dev`. Returns true
/// when it removed it, false when it was not there.
pub fn remove_address(netns: Option<&str>, dev: &str, cidr: Ipv4Cidr) -> Result<bool, AddressError> {
    if !addresses(netns, dev)?.contains(&cidr) {
        return Ok(false);
    }
    match Cmd::new("ip").netns(netns).args(["addr", "del", &cidr.to_string(), "dev", dev]).run() {
        Ok(_) => Ok(true),
        // Removed by someone else since the look above.
        Err(error)
            if error.stderr().contains("Address not found") || error.stderr().contains("Cannot assign requested") =>
        {
            Ok(false)
        }
        Err(error) => Err(address_error(error, netns, dev)),
    }
}

/// Creates bridge `name` in `netns` with multicast snooping off, and brings it up.
pub fn create_bridge(netns: &str, name: &str) -> Result<(), CommandError> {
    Cmd::new("ip").args(["-n", netns, "link", "add", name, "type", "bridge", "mcast_snooping", "0"]).run()?;
    Cmd::new("ip").args(["-n", netns, "link", "set", "dev", name, "up"]).run()?;
    Ok(())
}

/// Attaches port `port` of `netns` to bridge `bridge` there, and brings the port up.
pub fn attach_to_bridge(netns: &str, port: &str, bridge: &str) -> Result<(), CommandError> {
    Cmd::new("ip").args(["-n", netns, "link", "set", "dev", port, "master", bridge]).run()?;
    Cmd::new("ip").args(["-n", netns, "link", "set", "dev", port, "up"]).run()?;
    Ok(())
}

/// The ports attached to bridge `bridge` in `netns`.
pub fn bridge_ports(netns: &str, bridge: &str) -> Result<Vec<String>, CommandError> {
    let text = Cmd::new("ip").args(["-n", netns, "-j", "link", "show", "master", bridge]).run()?;
    let links: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
    Ok(links.iter().filter_map(|l| l["ifname"].as_str().map(str::to_string)).collect())
}

/// Creates veth pair `name` (in `netns`) ↔ `peer` (in `peer_netns`), both left down.
pub fn create_veth(netns: &str, name: &str, peer_netns: &str, peer: &str) -> Result<(), CommandError> {
    Cmd::new("ip")
        .args(["-n", netns, "link", "add", name, "type", "veth", "peer", "name", peer, "netns", peer_netns])
        .run()?;
    Ok(())
}

/// Makes `dev` hand the network one datagram at a time: the kernel segments a GSO batch (up to
/// 64 datagrams in one buffer) before the device rather than after it (`gso_max_segs 1`). A
/// lab's loss rule (iptables `statistic`) at a receiver otherwise sees a batch whole and drops
/// up to 64 datagrams at once, a loss pattern no real path has (its packets travel one by one).
pub fn one_datagram_at_a_time(netns: &str, dev: &str) -> Result<(), CommandError> {
    Cmd::new("ip").args(["-n", netns, "link", "set", "dev", dev, "gso_max_segs", "1"]).run()?;
    Ok(())
}

/// Creates a persistent TAP device `name` in `netns` (VDE legs attach to it and detach from it).
pub fn create_tap(netns: &str, name: &str) -> Result<(), CommandError> {
    Cmd::new("ip").args(["-n", netns, "tuntap", "add", "dev", name, "mode", "tap"]).run()?;
    Ok(())
}

/// Brings interface `dev` up.
pub fn link_up(netns: Option<&str>, dev: &str) -> Result<(), CommandError> {
    Cmd::new("ip").netns(netns).args(["link", "set", "dev", dev, "up"]).run()?;
    Ok(())
}

/// Sets the MAC address of `dev` (the lab makes them predictable for debugging).
pub fn set_mac(netns: Option<&str>, dev: &str, mac: &str) -> Result<(), CommandError> {
    Cmd::new("ip").netns(netns).args(["link", "set", "dev", dev, "address", mac]).run()?;
    Ok(())
}

/// Assigns the feed's private address to `dev`; an address already present is not an error.
pub fn set_address(netns: Option<&str>, dev: &str, address: Ipv4Cidr) -> Result<(), CommandError> {
    Cmd::new("ip").netns(netns).args(["addr", "replace", &address.to_string(), "dev", dev]).run()?;
    Ok(())
}

/// Assigns an IPv6 address to `dev` without duplicate address detection (usable at once; the
/// lab numbers its addresses itself); an address already present is not an error.
pub fn set_address6(netns: Option<&str>, dev: &str, address: ipnet::Ipv6Net) -> Result<(), CommandError> {
    Cmd::new("ip").netns(netns).args(["-6", "addr", "replace", &address.to_string(), "dev", dev, "nodad"]).run()?;
    Ok(())
}

/// Routes IPv6 multicast group `group` out of `dev`.
pub fn add_multicast_route6(netns: Option<&str>, dev: &str, group: std::net::Ipv6Addr) -> Result<(), CommandError> {
    Cmd::new("ip").netns(netns).args(["-6", "route", "replace", &format!("{group}/128"), "dev", dev]).run()?;
    Ok(())
}

/// The interface the route to `destination` leaves by (`ip route get`), if the kernel has a
/// route.
pub fn route_device(netns: Option<&str>, destination: Ipv4Addr) -> Result<Option<String>, CommandError> {
    let text = Cmd::new("ip").netns(netns).args(["-j", "route", "get", &destination.to_string()]).run()?;
    Ok(route_device_in(&text))
}

/// The first route's `dev` in `ip -j route get` output.
fn route_device_in(text: &str) -> Option<String> {
    let at = text.find("\"dev\":\"")? + "\"dev\":\"".len();
    let rest = &text[at..];
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

/// Routes multicast group `group` out of `dev`, so senders need not set IP_MULTICAST_IF.
pub fn add_multicast_route(netns: Option<&str>, dev: &str, group: Ipv4Addr) -> Result<(), CommandError> {
    Cmd::new("ip").netns(netns).args(["route", "replace", &format!("{group}/32"), "dev", dev]).run()?;
    Ok(())
}

/// The iptables arguments that drop `loss` of the packets arriving on `dev` (pure; see
/// [`install_receive_loss`]).
pub fn receive_loss_rule(dev: &str, loss: LossPercent) -> Vec<String> {
    [
        "-i",
        dev,
        "-m",
        "statistic",
        "--mode",
        "random",
        "--probability",
        &format!("{:.6}", loss.probability()),
        "-j",
        "DROP",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Drops `loss` of the packets arriving on `dev` (iptables `statistic`, chain INPUT), so
/// multicast, retransmissions and control traffic to that host are all affected.
pub fn install_receive_loss(netns: Option<&str>, dev: &str, loss: LossPercent) -> Result<(), CommandError> {
    install_receive_loss_with(netns, dev, loss, "iptables")
}

/// [`install_receive_loss`] for IPv6 (ip6tables `statistic`, the same rule).
pub fn install_receive_loss6(netns: Option<&str>, dev: &str, loss: LossPercent) -> Result<(), CommandError> {
    install_receive_loss_with(netns, dev, loss, "ip6tables")
}

fn install_receive_loss_with(
    netns: Option<&str>,
    dev: &str,
    loss: LossPercent,
    program: &str,
) -> Result<(), CommandError> {
    if loss.is_zero() {
        return Ok(());
    }
    let rule = receive_loss_rule(dev, loss);
    // Idempotent: add only when the same rule is not there yet.
    let present = Cmd::new(program).netns(netns).args(["-C", "INPUT"]).args(rule.clone()).run().is_ok();
    if !present {
        Cmd::new(program).netns(netns).args(["-A", "INPUT"]).args(rule).run()?;
    }
    Ok(())
}

/// Deletes interface `dev`; a missing interface is not an error.
pub fn delete_link(netns: Option<&str>, dev: &str) -> Result<(), CommandError> {
    match Cmd::new("ip").netns(netns).args(["link", "del", "dev", dev]).run() {
        Ok(_) => Ok(()),
        Err(error) if error.stderr().contains("Cannot find device") => Ok(()),
        Err(error) => Err(error),
    }
}

/// True when interface `dev` exists.
pub fn link_exists(netns: Option<&str>, dev: &str) -> bool {
    Cmd::new("ip").netns(netns).args(["link", "show", "dev", dev]).run().is_ok()
}

fn netns_text(netns: &Option<String>) -> String {
    match netns {
        Some(netns) => format!("network namespace {netns:?}"),
        None => "this network namespace".to_string(),
    }
}

fn address_error(error: CommandError, netns: Option<&str>, dev: &str) -> AddressError {
    let stderr = error.stderr();
    if stderr.contains("does not exist") || stderr.contains("Cannot find device") {
        AddressError::NoSuchInterface { netns: netns.map(str::to_string), dev: dev.to_string() }
    } else {
        AddressError::Command(error)
    }
}

fn check_host_address(cidr: Ipv4Cidr) -> Result<(), AddressError> {
    // /31 and /32 have no network or broadcast address (RFC 3021).
    let special = cidr.prefix_len <= 30 && (cidr.address == cidr.network() || cidr.address == cidr.broadcast());
    if special { Err(AddressError::NotAHostAddress { cidr }) } else { Ok(()) }
}

/// The interface with `address` in the output of `ip -j -4 addr show`.
fn interface_in(text: &str, address: Ipv4Addr) -> Result<Option<String>, String> {
    let links: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|error| error.to_string())?;
    for link in &links {
        let holds = link["addr_info"]
            .as_array()
            .is_some_and(|infos| infos.iter().any(|info| info["local"].as_str() == Some(&address.to_string())));
        if holds {
            return Ok(link["ifname"].as_str().map(str::to_string));
        }
    }
    Ok(None)
}

/// The IPv4 addresses in the output of `ip -j -4 addr show dev DEV`.
fn parse_addresses(text: &str) -> Result<Vec<Ipv4Cidr>, String> {
    let links: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|error| error.to_string())?;
    let mut found = Vec::new();
    for info in links.iter().filter_map(|l| l["addr_info"].as_array()).flatten() {
        if info["family"] != "inet" {
            continue;
        }
        let address = info["local"].as_str().and_then(|a| a.parse().ok());
        let prefix_len = info["prefixlen"].as_u64().and_then(|p| u8::try_from(p).ok()).filter(|p| *p <= 32);
        match (address, prefix_len) {
            (Some(address), Some(prefix_len)) => found.push(Ipv4Cidr { address, prefix_len }),
            _ => return Err(format!("an address entry without local and prefixlen: {info}")),
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_of_a_route_is_read_from_ip_route_get() {
        let text = r#"[{"type":"multicast","dst":"239.255.77.3","dev":"lo","prefsrc":"10.88.0.2","flags":[],"uid":0,"cache":["local","mc"]}]"#;
        assert_eq!(route_device_in(text).as_deref(), Some("lo"));
        assert_eq!(route_device_in("[]"), None);
    }

    #[test]
    fn the_interface_holding_an_address_is_found() {
        let text = r#"[{"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]},
            {"ifindex":5,"ifname":"ngrid","addr_info":[{"family":"inet","local":"10.77.1.1","prefixlen":24}]}]"#;
        assert_eq!(interface_in(text, Ipv4Addr::new(10, 77, 1, 1)).unwrap().as_deref(), Some("ngrid"));
        assert_eq!(interface_in(text, Ipv4Addr::new(10, 77, 1, 2)).unwrap(), None);
        assert!(interface_in("not json", Ipv4Addr::LOCALHOST).is_err());
    }

    #[test]
    fn cidr_arithmetic() {
        let cidr: Ipv4Cidr = "10.77.1.9/24".parse().unwrap();
        assert_eq!(cidr.network(), Ipv4Addr::new(10, 77, 1, 0));
        assert_eq!(cidr.broadcast(), Ipv4Addr::new(10, 77, 1, 255));
        assert_eq!(cidr.nth(1), Some(Ipv4Addr::new(10, 77, 1, 1)));
        assert_eq!(cidr.nth(256), None);
        assert!("10.77.1.0".parse::<Ipv4Cidr>().is_err());
        assert!("10.77.1.0/33".parse::<Ipv4Cidr>().is_err());
    }

    #[test]
    fn address_lists_are_parsed_from_ip_json() {
        let text = r#"[{"ifindex":3,"ifname":"ngrid","addr_info":[
            {"family":"inet","local":"10.77.1.2","prefixlen":24,"scope":"global"},
            {"family":"inet","local":"10.77.1.9","prefixlen":32}]}]"#;
        let found = parse_addresses(text).unwrap();
        assert_eq!(found, ["10.77.1.2/24".parse().unwrap(), "10.77.1.9/32".parse().unwrap()]);
        assert_eq!(parse_addresses("[]").unwrap(), []);
        assert!(parse_addresses("Device \"x\" does not exist.").is_err());
        let broken = r#"[{"addr_info":[{"family":"inet","local":"10.77.1.2"}]}]"#;
        assert!(parse_addresses(broken).unwrap_err().contains("without local and prefixlen"));
    }

    #[test]
    fn only_host_addresses_are_configured() {
        let refused = check_host_address("10.77.1.0/24".parse().unwrap()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "10.77.1.0/24 is the network or broadcast address of 10.77.1.0/24; give a host address of it"
        );
        assert!(check_host_address("10.77.1.255/24".parse().unwrap()).is_err());
        assert!(check_host_address("10.77.1.2/24".parse().unwrap()).is_ok());
        assert!(check_host_address("10.77.1.0/31".parse().unwrap()).is_ok());
        assert!(check_host_address("10.77.1.0/32".parse().unwrap()).is_ok());
        let missing = AddressError::NoSuchInterface { netns: Some("l-s1".into()), dev: "ngrid".into() };
        assert_eq!(
            missing.to_string(),
            "interface \"ngrid\" does not exist in network namespace \"l-s1\"; check the name (in a lab host: the \
             feed's name, and is the lab up?)"
        );
    }

    #[test]
    fn loss_rule_is_a_statistic_match() {
        assert_eq!(
            receive_loss_rule("ngrid", LossPercent::new(5.0).unwrap()).join(" "),
            "-i ngrid -m statistic --mode random --probability 0.050000 -j DROP"
        );
    }
}
