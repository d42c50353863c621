//! Host configuration for a feed: the feed interface, its private address, the multicast route,
//! receive-side loss, and (at the publisher) the HTB tree of [`crate::tc`].
//!
//! On a real host the feed interface is an 802.1Q interface on the NIC facing the multipoint
//! path (`ip link add link eth1 name eth1.332 type vlan id 332`); this kernel has no 802.1Q
//! module, so the lab uses a veth leg (bridge paths) or a persistent TAP device (VDE paths).
//! Every function takes the namespace to work in (`None` = the current one) and fails with a
//! [`CommandError`] naming the command.

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

/// Creates veth pair `name` (in `netns`) ↔ `peer` (in `peer_netns`), both left down.
pub fn create_veth(netns: &str, name: &str, peer_netns: &str, peer: &str) -> Result<(), CommandError> {
    Cmd::new("ip")
        .args(["-n", netns, "link", "add", name, "type", "veth", "peer", "name", peer, "netns", peer_netns])
        .run()?;
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
    if loss.is_zero() {
        return Ok(());
    }
    let rule = receive_loss_rule(dev, loss);
    // Idempotent: add only when the same rule is not there yet.
    let present = Cmd::new("iptables").netns(netns).args(["-C", "INPUT"]).args(rule.clone()).run().is_ok();
    if !present {
        Cmd::new("iptables").netns(netns).args(["-A", "INPUT"]).args(rule).run()?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn loss_rule_is_a_statistic_match() {
        assert_eq!(
            receive_loss_rule("ngrid", LossPercent::new(5.0).unwrap()).join(" "),
            "-i ngrid -m statistic --mode random --probability 0.050000 -j DROP"
        );
    }
}
