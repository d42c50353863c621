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
//!
//! An IPv6 feed (an ldm7 extension) has an IPv6 subnet: every address of it but the prefix's
//! own (the subnet-router anycast address) and the server's; IPv6 has no broadcast address.

use std::collections::{BTreeSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Why no address could be handed out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// Every address of the subnet is allocated.
    #[error("all {capacity} addresses of {subnet} are allocated: enlarge the feed's subnet (MULTICAST … subnetLen)")]
    Exhausted {
        /// The subnet.
        subnet: IpNet,
        /// Its host addresses (minus the server's).
        capacity: u64,
    },
    /// The feed serves its most subscribers already.
    #[error("the feed has {0} subscribers already (subscribers_max): raise it in the settings file")]
    TooManySubscribers(usize),
    /// The subnet cannot hold a pool.
    #[error("{0} has no host address besides the FMTP server's: use a prefix of 30 bits or shorter (IPv6: 126)")]
    NoHosts(IpNet),
    /// The server address is the subnet's network or broadcast address.
    #[error("the FMTP server address {0} is the network or broadcast address of its subnet")]
    ServerAddress(IpNet),
}

/// One feed's pool.
#[derive(Debug, Clone)]
pub struct Pool {
    subnet: IpNet,
    /// Next never-allocated host number (1 = first host address).
    next_fresh: u128,
    /// Host numbers of released addresses, oldest release first.
    released: VecDeque<u128>,
    /// Addresses currently allocated or allowed.
    held: BTreeSet<IpAddr>,
    subscribers_max: usize,
}

impl Pool {
    /// The pool of the subnet `server` belongs to (`server` is the FMTP server's address and
    /// prefix), holding at most `subscribers_max` addresses at once.
    pub fn new(server: impl Into<IpNet>, subscribers_max: usize) -> Result<Self, PoolError> {
        let server = server.into();
        let bits = server.max_prefix_len() - server.prefix_len();
        let is_network = server.addr() == server.network();
        let is_broadcast = server.addr().is_ipv4() && server.addr() == server.broadcast();
        if bits >= 2 && (is_network || is_broadcast) {
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
    pub fn subnet(&self) -> IpNet {
        self.subnet
    }

    /// How many addresses the pool can hand out.
    pub fn capacity(&self) -> u64 {
        u64::try_from(self.host_count().saturating_sub(1)).unwrap_or(u64::MAX)
    }

    /// Takes the lowest available address.
    pub fn allocate(&mut self) -> Result<IpAddr, PoolError> {
        if self.held.len() >= self.subscribers_max {
            return Err(PoolError::TooManySubscribers(self.subscribers_max));
        }
        while self.next_fresh <= self.host_count() {
            let host = self.next_fresh;
            self.next_fresh += 1;
            let Some(address) = self.address_of(host) else { break };
            if address != self.subnet.addr() && !self.held.contains(&address) {
                self.held.insert(address);
                return Ok(address);
            }
        }
        while let Some(host) = self.released.pop_front() {
            if let Some(address) = self.address_of(host)
                && !self.held.contains(&address)
            {
                self.held.insert(address);
                return Ok(address);
            }
        }
        Err(PoolError::Exhausted { subnet: self.subnet, capacity: self.capacity() })
    }

    /// Authorizes `address` (e.g. the subscriber's own) without taking it from the pool.
    pub fn allow(&mut self, address: IpAddr) -> Result<(), PoolError> {
        if self.held.len() >= self.subscribers_max && !self.held.contains(&address) {
            return Err(PoolError::TooManySubscribers(self.subscribers_max));
        }
        self.held.insert(address);
        Ok(())
    }

    /// Gives `address` back: no longer authorized; if it is of the subnet, it is handed out again
    /// after the never-used ones.
    pub fn release(&mut self, address: IpAddr) {
        if !self.held.remove(&address) {
            return;
        }
        if let Some(host) = self.host_number(address)
            && host < self.next_fresh
        {
            self.released.push_back(host);
        }
    }

    /// Whether a repair connection from `address` is authorized.
    pub fn is_allowed(&self, address: IpAddr) -> bool {
        self.held.contains(&address)
    }

    /// Addresses held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Host addresses of the subnet: IPv4 without network and broadcast (/31 and /32 have 2
    /// and 1), IPv6 without the prefix's own address (/127 and /128 have 2 and 1).
    fn host_count(&self) -> u128 {
        let bits = u32::from(self.subnet.max_prefix_len() - self.subnet.prefix_len());
        let excluded = if self.subnet.addr().is_ipv4() { 2 } else { 1 };
        match bits {
            0 => 1,
            1 => 2,
            128 => u128::MAX,
            bits => (1u128 << bits) - excluded,
        }
    }

    /// Whether host numbers start at the prefix's own address (/31, /32, /127, /128).
    fn point_to_point(&self) -> bool {
        self.subnet.max_prefix_len() - self.subnet.prefix_len() <= 1
    }

    fn address_of(&self, host: u128) -> Option<IpAddr> {
        let offset = if self.point_to_point() { host - 1 } else { host };
        match self.subnet.network() {
            IpAddr::V4(network) => {
                u32::try_from(u128::from(u32::from(network)) + offset).ok().map(|a| IpAddr::V4(Ipv4Addr::from(a)))
            }
            IpAddr::V6(network) => u128::from(network).checked_add(offset).map(|a| IpAddr::V6(Ipv6Addr::from(a))),
        }
    }

    fn host_number(&self, address: IpAddr) -> Option<u128> {
        if !self.subnet.contains(&address) {
            return None;
        }
        let value = |address: IpAddr| match address {
            IpAddr::V4(v4) => u128::from(u32::from(v4)),
            IpAddr::V6(v6) => u128::from(v6),
        };
        let offset = value(address) - value(self.subnet.network());
        let host = if self.point_to_point() { offset + 1 } else { offset };
        (host >= 1 && host <= self.host_count()).then_some(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn hands_out_the_lowest_then_the_released() {
        let mut pool = Pool::new(cidr("10.77.1.1/29"), 100).unwrap();
        assert_eq!(pool.capacity(), 5); // .2 … .6
        let first: Vec<IpAddr> = (0..5).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(first, ["10.77.1.2", "10.77.1.3", "10.77.1.4", "10.77.1.5", "10.77.1.6"].map(ip));
        assert!(matches!(pool.allocate(), Err(PoolError::Exhausted { capacity: 5, .. })));
        pool.release("10.77.1.4".parse().unwrap());
        pool.release("10.77.1.2".parse().unwrap());
        assert!(!pool.is_allowed("10.77.1.4".parse().unwrap()));
        assert_eq!(pool.allocate().unwrap(), "10.77.1.4".parse::<IpAddr>().unwrap());
        assert_eq!(pool.allocate().unwrap(), "10.77.1.2".parse::<IpAddr>().unwrap());
        assert!(pool.is_allowed("10.77.1.6".parse().unwrap()));
    }

    #[test]
    fn the_server_address_is_skipped_and_checked() {
        let mut pool = Pool::new(cidr("127.0.0.2/24"), 1000).unwrap();
        assert_eq!(pool.allocate().unwrap(), "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(pool.allocate().unwrap(), "127.0.0.3".parse::<IpAddr>().unwrap());
        assert!(matches!(Pool::new(cidr("10.0.0.0/24"), 1), Err(PoolError::ServerAddress(_))));
        assert!(matches!(Pool::new(cidr("10.0.0.255/24"), 1), Err(PoolError::ServerAddress(_))));
        assert!(matches!(Pool::new(cidr("10.0.0.1/32"), 1), Err(PoolError::NoHosts(_))));
        let mut point = Pool::new(cidr("10.0.0.0/31"), 5).unwrap();
        assert_eq!(point.allocate().unwrap(), "10.0.0.1".parse::<IpAddr>().unwrap());
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

    #[test]
    fn ipv6_pools_have_no_broadcast_address() {
        let mut pool = Pool::new(cidr("fd00:77:1::1/125"), 100).unwrap();
        // ::0 is the prefix's own address, ::1 the server's: ::2 … ::7.
        assert_eq!(pool.capacity(), 6);
        let all: Vec<IpAddr> = (0..6).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(all.first(), Some(&ip("fd00:77:1::2")));
        assert_eq!(all.last(), Some(&ip("fd00:77:1::7")));
        assert!(matches!(pool.allocate(), Err(PoolError::Exhausted { capacity: 6, .. })));
        pool.release(ip("fd00:77:1::3"));
        assert_eq!(pool.allocate().unwrap(), ip("fd00:77:1::3"));
        let mut wide = Pool::new(cidr("fd00:77:2::1/64"), 3).unwrap();
        assert_eq!(wide.capacity(), u64::MAX - 1);
        assert_eq!(wide.allocate().unwrap(), ip("fd00:77:2::2"));
        assert!(matches!(Pool::new(cidr("fd00:77:2::/64"), 1), Err(PoolError::ServerAddress(_))));
        assert!(matches!(Pool::new(cidr("fd00:77:2::1/128"), 1), Err(PoolError::NoHosts(_))));
    }
}
