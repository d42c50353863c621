//! The FMTP client address pool of one multicast feed (ldm7-multicast.md §4.2): the private
//! addresses the publisher hands to subscribers, acting as the DHCP of the feed's path
//! (RESEARCH.md §2), and the set of addresses whose repair connections are authorized (§4.3).
//!
//! Invariants (as the reference): the pool is every host address of the feed's subnet except the
//! network address, the broadcast address and the FMTP server's own address; [`Pool::allocate`]
//! hands out the lowest never-used address first, then released ones in release order;
//! [`Pool::allow`] authorizes an address without taking it from the pool (a subscriber that
//! keeps its own address, e.g. on a /32 feed); [`Pool::release`] does both undos. The number of
//! addresses held at once is bounded by [`Pool::capacity`] (the subnet) and by the feed's
//! `subscribers_max`; a refusal says which.

use std::collections::{BTreeSet, VecDeque};
use std::net::Ipv4Addr;

use crate::hostcfg::Ipv4Cidr;

/// Why no address could be handed out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// Every address of the subnet is allocated.
    #[error("all {capacity} addresses of {subnet} are allocated: enlarge the feed's subnet (MULTICAST … subnetLen)")]
    Exhausted {
        /// The subnet.
        subnet: Ipv4Cidr,
        /// Its host addresses (minus the server's).
        capacity: u64,
    },
    /// The feed serves its most subscribers already.
    #[error("the feed has {0} subscribers already (subscribers_max): raise it in the settings file")]
    TooManySubscribers(usize),
    /// The subnet cannot hold a pool.
    #[error("{0} has no host address besides the FMTP server's: use a prefix of 30 bits or shorter")]
    NoHosts(Ipv4Cidr),
    /// The server address is the subnet's network or broadcast address.
    #[error("the FMTP server address {0} is the network or broadcast address of its subnet")]
    ServerAddress(Ipv4Cidr),
}

/// One feed's pool.
#[derive(Debug, Clone)]
pub struct Pool {
    subnet: Ipv4Cidr,
    /// Next never-allocated host number (1 = first host address).
    next_fresh: u64,
    /// Host numbers of released addresses, oldest release first.
    released: VecDeque<u32>,
    /// Addresses currently allocated or allowed.
    held: BTreeSet<Ipv4Addr>,
    subscribers_max: usize,
}

impl Pool {
    /// The pool of the subnet `server` belongs to (`server` is the FMTP server's address and
    /// prefix), holding at most `subscribers_max` addresses at once.
    pub fn new(server: Ipv4Cidr, subscribers_max: usize) -> Result<Self, PoolError> {
        if server.prefix_len < 31 && (server.address == server.network() || server.address == server.broadcast()) {
            return Err(PoolError::ServerAddress(server));
        }
        let pool = Self {
            subnet: server,
            next_fresh: 1,
            released: VecDeque::new(),
            held: BTreeSet::new(),
            subscribers_max: subscribers_max.max(1),
        };
        if pool.capacity() == 0 {
            return Err(PoolError::NoHosts(server));
        }
        Ok(pool)
    }

    /// The subnet (the server's address and prefix).
    pub fn subnet(&self) -> Ipv4Cidr {
        self.subnet
    }

    /// How many addresses the pool can hand out.
    pub fn capacity(&self) -> u64 {
        self.host_count().saturating_sub(1)
    }

    /// Takes the lowest available address.
    pub fn allocate(&mut self) -> Result<Ipv4Addr, PoolError> {
        if self.held.len() >= self.subscribers_max {
            return Err(PoolError::TooManySubscribers(self.subscribers_max));
        }
        while self.next_fresh <= self.host_count() {
            let host = self.next_fresh;
            self.next_fresh += 1;
            let Some(address) = self.address_of(host) else { break };
            if address != self.subnet.address && !self.held.contains(&address) {
                self.held.insert(address);
                return Ok(address);
            }
        }
        while let Some(host) = self.released.pop_front() {
            if let Some(address) = self.address_of(u64::from(host)) {
                if !self.held.contains(&address) {
                    self.held.insert(address);
                    return Ok(address);
                }
            }
        }
        Err(PoolError::Exhausted { subnet: self.subnet, capacity: self.capacity() })
    }

    /// Authorizes `address` (e.g. the subscriber's own) without taking it from the pool.
    pub fn allow(&mut self, address: Ipv4Addr) -> Result<(), PoolError> {
        if self.held.len() >= self.subscribers_max && !self.held.contains(&address) {
            return Err(PoolError::TooManySubscribers(self.subscribers_max));
        }
        self.held.insert(address);
        Ok(())
    }

    /// Gives `address` back: no longer authorized; if it is of the subnet, it is handed out again
    /// after the never-used ones.
    pub fn release(&mut self, address: Ipv4Addr) {
        if !self.held.remove(&address) {
            return;
        }
        if let Some(host) = self.host_number(address) {
            if u64::from(host) < self.next_fresh {
                self.released.push_back(host);
            }
        }
    }

    /// Whether a repair connection from `address` is authorized.
    pub fn is_allowed(&self, address: Ipv4Addr) -> bool {
        self.held.contains(&address)
    }

    /// Addresses held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Host addresses of the subnet (network and broadcast excluded; /31 and /32 have 2 and 1).
    fn host_count(&self) -> u64 {
        match self.subnet.prefix_len {
            32 => 1,
            31 => 2,
            prefix => (1u64 << (32 - prefix)) - 2,
        }
    }

    fn address_of(&self, host: u64) -> Option<Ipv4Addr> {
        let base = u64::from(u32::from(self.subnet.network()));
        let offset = if self.subnet.prefix_len >= 31 { host - 1 } else { host };
        u32::try_from(base + offset).ok().map(Ipv4Addr::from)
    }

    fn host_number(&self, address: Ipv4Addr) -> Option<u32> {
        let network = u32::from(self.subnet.network());
        let value = u32::from(address);
        let same_network = Ipv4Cidr { address, prefix_len: self.subnet.prefix_len }.network() == self.subnet.network();
        if !same_network {
            return None;
        }
        let offset = value - network;
        let host = if self.subnet.prefix_len >= 31 { offset + 1 } else { offset };
        (u64::from(host) >= 1 && u64::from(host) <= self.host_count()).then_some(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Ipv4Cidr {
        text.parse().unwrap()
    }

    #[test]
    fn hands_out_the_lowest_then_the_released() {
        let mut pool = Pool::new(cidr("10.77.1.1/29"), 100).unwrap();
        assert_eq!(pool.capacity(), 5); // .2 … .6
        let first: Vec<Ipv4Addr> = (0..5).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(
            first,
            ["10.77.1.2", "10.77.1.3", "10.77.1.4", "10.77.1.5", "10.77.1.6"].map(|a| a.parse::<Ipv4Addr>().unwrap())
        );
        assert!(matches!(pool.allocate(), Err(PoolError::Exhausted { capacity: 5, .. })));
        pool.release("10.77.1.4".parse().unwrap());
        pool.release("10.77.1.2".parse().unwrap());
        assert!(!pool.is_allowed("10.77.1.4".parse().unwrap()));
        assert_eq!(pool.allocate().unwrap(), "10.77.1.4".parse::<Ipv4Addr>().unwrap());
        assert_eq!(pool.allocate().unwrap(), "10.77.1.2".parse::<Ipv4Addr>().unwrap());
        assert!(pool.is_allowed("10.77.1.6".parse().unwrap()));
    }

    #[test]
    fn the_server_address_is_skipped_and_checked() {
        let mut pool = Pool::new(cidr("127.0.0.2/24"), 1000).unwrap();
        assert_eq!(pool.allocate().unwrap(), "127.0.0.1".parse::<Ipv4Addr>().unwrap());
        assert_eq!(pool.allocate().unwrap(), "127.0.0.3".parse::<Ipv4Addr>().unwrap());
        assert!(matches!(Pool::new(cidr("10.0.0.0/24"), 1), Err(PoolError::ServerAddress(_))));
        assert!(matches!(Pool::new(cidr("10.0.0.255/24"), 1), Err(PoolError::ServerAddress(_))));
        assert!(matches!(Pool::new(cidr("10.0.0.1/32"), 1), Err(PoolError::NoHosts(_))));
        let mut point = Pool::new(cidr("10.0.0.0/31"), 5).unwrap();
        assert_eq!(point.allocate().unwrap(), "10.0.0.1".parse::<Ipv4Addr>().unwrap());
    }

    #[test]
    fn large_subnets_are_not_materialized_and_subscribers_are_bounded() {
        let mut pool = Pool::new(cidr("127.0.0.1/8"), 2).unwrap();
        assert_eq!(pool.capacity(), (1 << 24) - 3);
        pool.allocate().unwrap();
        pool.allow("192.0.2.7".parse().unwrap()).unwrap();
        assert_eq!(pool.allocate(), Err(PoolError::TooManySubscribers(2)));
        pool.release("192.0.2.7".parse().unwrap());
        assert!(pool.allocate().is_ok());
    }
}
