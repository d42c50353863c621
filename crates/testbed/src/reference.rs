//! The reference LDM beside ldm7 in the test bed: Unidata LDM-7 (6.13.17 with its multicast
//! module, `../shared/tools/build-reference-ldm7.sh`, found through `LDM7_REF_BIN`) and Unidata
//! LDM 6.15 (`../shared/tools/build-reference-ldm.sh`, `LDM_REF_BIN`), each an `ldmd` in a
//! network namespace of its own ([`Host`]) next to `ldm7 serve` ([`crate::Server`]).
//!
//! What running the reference LDM-7 takes (the build script's header, and what these tests
//! found):
//!
//! - its daemons run as the build's user (`ldm`), with its `bin/` first on `PATH` (`ldmd` runs
//!   `mldm_sender` by name) and a `HOME` that user can write (`mldm_sender` keeps a secret file
//!   there); [`RefServer`] gives each server a directory of its own, owned by that user, with
//!   its own registry (`LDM_REGISTRY_DIR`: time offset, retransmission timeout, anti-DoS off);
//! - LDM resolves addresses with `AI_ADDRCONFIG`, which fails for 127.0.0.1 when loopback holds
//!   the only IPv4 address: a [`Host`] has a veth pair with 10.x addresses besides loopback;
//!   multicast runs on loopback (`lo` multicast on, 224.0.0.0/4 routed to it);
//! - the MAC level comes from `FMTP_MAC_LEVEL` in both daemons' environments;
//! - a product inserted with `pqinsert` is multicast once the upstream is woken (SIGCONT to
//!   the server's process group, as `pqinsert` itself would signal `ldmd`);
//! - a subscriber keeps its session memory in the build's `var/logs/<host>:<port>_<feed>.yaml`
//!   (the path is compiled in): [`RefServer`] removes the files of its ports when dropped.
//!
//! Both systems' logs are read into the same shape ([`deliveries`], [`sent`]): the reference
//! and ldm7 write the same per-product lines (ldm7-multicast.md §5), with different detail.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ldm7_net::command::Cmd;
use ldm7_types::Signature;
use md5::{Digest, Md5};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::records::DeliveryMode;
use crate::{Result, TestbedError, io_error, tail, wait_for};

/// The variable naming the reference LDM-7 build's `bin/`.
pub const LDM7_REF_BIN: &str = "LDM7_REF_BIN";
/// The variable naming the reference LDM 6.15 build's `bin/`.
pub const LDM6_REF_BIN: &str = "LDM_REF_BIN";

/// How long a reference server may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long it may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server being dropped may take to exit after SIGTERM, before SIGKILL.
const DROP_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A reference build: its `bin/` and the user its daemons run as.
#[derive(Clone, Debug)]
pub struct Reference {
    /// The build's `bin/`.
    pub bin: PathBuf,
    /// The user its daemons run as (`None`: the current user, as the LDM 6.15 tests run it).
    pub user: Option<String>,
    /// Whether it is the LDM-7 build (6.13.17 with multicast).
    pub multicast: bool,
}

impl Reference {
    /// The reference LDM-7 named by `LDM7_REF_BIN`: `None` when the variable is unset; an error
    /// when it names no build.
    pub fn ldm7() -> Result<Option<Reference>> {
        Self::from_env(LDM7_REF_BIN, &["ldmd", "mldm_sender", "pqinsert", "pqcreate", "pqcat"], true)
    }

    /// The reference LDM 6.15 named by `LDM_REF_BIN`, likewise.
    pub fn ldm6() -> Result<Option<Reference>> {
        Self::from_env(LDM6_REF_BIN, &["ldmd", "pqinsert", "pqcreate", "pqcat"], false)
    }

    fn from_env(variable: &str, programs: &[&str], multicast: bool) -> Result<Option<Reference>> {
        let Some(bin) = std::env::var_os(variable).map(PathBuf::from) else { return Ok(None) };
        if let Some(missing) = programs.iter().find(|program| !bin.join(program).is_file()) {
            return Err(TestbedError::Io {
                what: format!("{variable}={}", bin.display()),
                source: std::io::Error::other(format!("no {missing} there: point it at a reference build's bin/")),
            });
        }
        let user = if multicast {
            // The owner of the build's files is the user the build script made for it.
            use std::os::unix::fs::MetadataExt;
            let uid = std::fs::metadata(bin.join("ldmd")).map_err(io_error(format!("stat {}", bin.display())))?.uid();
            let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .map(|user| user.name)
                .unwrap_or_else(|| "ldm".into());
            Some(user)
        } else {
            None
        };
        Ok(Some(Reference { bin, user, multicast }))
    }

    /// The build's home (`LDMHOME`, the parent of `bin/`).
    pub fn home(&self) -> PathBuf {
        self.bin.parent().map(Path::to_path_buf).unwrap_or_else(|| self.bin.clone())
    }

    /// A command running `program` of the build as its user, in `netns` (when given), with
    /// `env` set (and nothing else of this process's environment but `PATH` and `HOME`).
    pub fn command(&self, netns: Option<&str>, home: &Path, program: &str, env: &[(&str, String)]) -> Command {
        let mut command = match netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns]);
                command
            }
            None => Command::new("env"),
        };
        if netns.is_some() {
            command.arg("env");
        }
        command.arg("-i");
        command.arg(format!("PATH={}:/usr/sbin:/usr/bin:/sbin:/bin", self.bin.display()));
        command.arg(format!("HOME={}", home.display()));
        for (name, value) in env {
            command.arg(format!("{name}={value}"));
        }
        if let Some(user) = &self.user {
            // setpriv execs (no process in between): the child's pid is the program's.
            command.args(["setpriv", "--reuid", user, "--regid", user, "--init-groups"]);
        }
        command.arg(self.bin.join(program));
        command
    }

    /// Makes `path` (a directory) and hands it to the build's user.
    pub fn own(&self, path: &Path) -> Result<()> {
        std::fs::create_dir_all(path).map_err(io_error(format!("create {}", path.display())))?;
        self.give(path)
    }

    /// Hands `path` (a file or directory) to the build's user.
    pub fn give(&self, path: &Path) -> Result<()> {
        if let Some(user) = &self.user {
            let account = nix::unistd::User::from_name(user).ok().flatten().ok_or_else(|| TestbedError::Io {
                what: format!("look up user {user}"),
                source: std::io::Error::other("no such user"),
            })?;
            nix::unistd::chown(path, Some(account.uid), Some(account.gid)).map_err(|errno| TestbedError::Io {
                what: format!("chown {}", path.display()),
                source: errno.into(),
            })?;
        }
        Ok(())
    }

    /// Every product of the reference queue `queue`, in queue order, each checked against its
    /// MD5 signature (`pqcat` with its debug log names each product's signature).
    pub fn held(&self, home: &Path, queue: &Path) -> Result<Vec<Held>> {
        let mut command = self.command(None, home, "pqcat", &[]);
        command.args(["-l", "-", "-x", "-q"]).arg(queue).current_dir(home).stdin(Stdio::null());
        let output = command.output().map_err(io_error("run pqcat"))?;
        if !output.status.success() {
            return Err(TestbedError::Queue {
                path: queue.to_path_buf(),
                message: tail(&String::from_utf8_lossy(&output.stderr), 5),
            });
        }
        let log = String::from_utf8_lossy(&output.stderr);
        let mut data = &output.stdout[..];
        let mut held = Vec::new();
        for line in log.lines() {
            let Some((_, product)) = line.split_once("writeprod:") else { continue };
            let Some((_, product)) = product.split_once("INFO") else { continue };
            let product = product.trim_start();
            let (signature, info) = product.split_once(char::is_whitespace).unwrap_or((product, ""));
            let size: usize = info.split_whitespace().next().and_then(|size| size.parse().ok()).unwrap_or(0);
            let (bytes, rest) = data.split_at(size.min(data.len()));
            data = rest;
            let signature: Signature = signature.parse().map_err(|_| TestbedError::Queue {
                path: queue.to_path_buf(),
                message: format!("pqcat named no signature: {line}"),
            })?;
            let digest: [u8; 16] = Md5::digest(bytes).into();
            held.push(Held {
                signature,
                size: bytes.len() as u64,
                intact: Signature(digest) == signature && bytes.len() == size,
                info: info.to_string(),
            });
        }
        Ok(held)
    }
}

/// One product of a queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Its signature.
    pub signature: Signature,
    /// Its size, bytes.
    pub size: u64,
    /// Whether its data hashes to its signature.
    pub intact: bool,
    /// Its printed metadata (`ldm-formats.md` §5).
    pub info: String,
}

impl From<&crate::ProductRecord> for Held {
    fn from(record: &crate::ProductRecord) -> Held {
        Held { signature: record.signature, size: record.size, intact: record.intact, info: record.info.clone() }
    }
}

/// One network namespace for a pairing: loopback up with multicast (224.0.0.0/4 routed to it,
/// GSO off so that each datagram is a packet to iptables) and a veth pair with the addresses 10.x.y.1 and 10.x.y.2, for the reference's address
/// look-ups. Dropping it kills its processes and deletes it (with its iptables rules).
#[derive(Debug)]
pub struct Host {
    name: String,
    address: Ipv4Addr,
    /// This end's address on the veth pair to a neighbor ([`Host::linked`]).
    link: Option<Ipv4Addr>,
    /// Whether dropping it deletes the namespace (not a lab's host: the lab does).
    owned: bool,
}

impl Host {
    /// Makes the namespace (`tag` goes in its name).
    pub fn up(tag: &str) -> Result<Host> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let serial = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("l7r-{tag}-{pid}-{serial}");
        // 10.(200 + pid mod 50).(serial mod 250).1: distinct per test of a run (addresses of
        // namespaces do not meet, but a readable log helps).
        let address = Ipv4Addr::new(10, 200 + (pid % 50) as u8, (serial % 250) as u8, 1);
        if ldm7_net::netns::exists(&name) {
            let _ = ldm7_net::netns::delete(&name);
        }
        ldm7_net::netns::add(&name)?;
        let host = Host { name, address, link: None, owned: true };
        let ns = Some(host.name.as_str());
        let peer = Ipv4Addr::from(u32::from(address) + 1);
        for args in [
            vec!["link", "set", "lo", "up"],
            vec!["link", "set", "lo", "multicast", "on"],
            // One datagram per packet: loopback passes a GSO batch (ldm7 sends blocks so) whole,
            // and iptables would drop or count a batch as one packet.
            vec!["link", "set", "lo", "gso_max_segs", "1"],
            vec!["route", "add", "224.0.0.0/4", "dev", "lo"],
            vec!["link", "add", "ref0", "type", "veth", "peer", "name", "ref1"],
        ] {
            Cmd::new("ip").netns(ns).args(args).run()?;
        }
        for (device, address) in [("ref0", address), ("ref1", peer)] {
            Cmd::new("ip").netns(ns).args(["addr", "add", &format!("{address}/24"), "dev", device]).run()?;
            Cmd::new("ip").netns(ns).args(["link", "set", device, "up"]).run()?;
        }
        Ok(host)
    }

    /// A second namespace joined to this one by a veth pair — `link0` here with
    /// [`Host::link_address`], `link1` there with the neighbor's [`Host::address`] — so that
    /// multicast sent out `link0` reaches receivers joined on `link1` (and, looped back, on
    /// `link0`). Two FMTP receivers of one group cannot share a host when one is the
    /// reference's: it binds the group's port without `SO_REUSEADDR`.
    pub fn linked(&mut self, tag: &str) -> Result<Host> {
        let mut neighbor = Host::up(tag)?;
        let base = u32::from(self.address) + (128 << 8);
        let (here, there) = (Ipv4Addr::from(base), Ipv4Addr::from(base + 1));
        let ns = Some(self.name.as_str());
        Cmd::new("ip")
            .netns(ns)
            .args(["link", "add", "link0", "type", "veth", "peer", "name", "link1", "netns", neighbor.name()])
            .run()?;
        for (netns, device, address) in [(self.name.as_str(), "link0", here), (neighbor.name(), "link1", there)] {
            Cmd::new("ip").netns(Some(netns)).args(["addr", "add", &format!("{address}/24"), "dev", device]).run()?;
            Cmd::new("ip").netns(Some(netns)).args(["link", "set", device, "up"]).run()?;
            Cmd::new("ip").netns(Some(netns)).args(["link", "set", device, "gso_max_segs", "1"]).run()?;
        }
        self.link = Some(here);
        neighbor.address = there;
        Ok(neighbor)
    }

    /// A host of an `ldm7 lab` ([`crate::Lab`]) at its IPv4 `address`, for a reference server
    /// among ldm7 ones; the lab keeps the namespace (dropping this leaves it).
    pub fn in_lab(netns: &str, address: Ipv4Addr) -> Host {
        Host { name: netns.to_owned(), address, link: None, owned: false }
    }

    /// This end's address on the veth pair to its neighbor, once [`Host::linked`].
    pub fn link_address(&self) -> Option<Ipv4Addr> {
        self.link
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its non-loopback address.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// Drops the given share of the UDP datagrams arriving for `port` (iptables `statistic`):
    /// the receive loss of the subscribers listening there.
    pub fn lose_datagrams(&self, port: u16, probability: f64) -> Result<()> {
        let probability = probability.to_string();
        self.drop_udp("-A", port, &["-m", "statistic", "--mode", "random", "--probability", &probability])
    }

    /// Drops the first `datagrams` UDP datagrams for `port` of FMTP product `index` (the
    /// header's first word, iptables `u32`; a `limit` burst counts them): with `datagrams` =
    /// its BOP, blocks and EOP, the product is lost whole and anything sent later for it (a
    /// repeated EOP) arrives.
    pub fn lose_product(&self, port: u16, index: u32, datagrams: u32) -> Result<()> {
        let (header, burst) = (format!("0>>22&0x3C@8={index}"), datagrams.to_string());
        let limit = ["-m", "limit", "--limit", "1/hour", "--limit-burst", &burst];
        self.drop_udp("-I", port, &[&["-m", "u32", "--u32", &header][..], &limit[..]].concat())
    }

    /// An iptables rule (appended with `-A`, first with `-I`) dropping the UDP datagrams for
    /// `port` that `matches` match.
    fn drop_udp(&self, position: &str, port: u16, matches: &[&str]) -> Result<()> {
        let port = port.to_string();
        let rule = [&[position, "INPUT", "-p", "udp", "--dport", &port][..], matches, &["-j", "DROP"]].concat();
        self.iptables(&rule)
    }

    fn iptables(&self, args: &[&str]) -> Result<()> {
        Cmd::new("iptables").netns(Some(&self.name)).args(args.iter().copied()).run()?;
        Ok(())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        ldm7_net::netns::kill_processes(&self.name);
        let _ = ldm7_net::netns::delete(&self.name);
    }
}

/// Settings a reference server reads from its registry.
#[derive(Clone, Debug)]
pub struct Registry {
    /// `/server/time-offset`: the backlog a new subscriber asks for, seconds.
    pub time_offset_secs: u32,
    /// `/fmtp-retx-timeout`: how long the FMTP sender repairs a product, seconds.
    pub retx_timeout_secs: u32,
}

impl Default for Registry {
    fn default() -> Registry {
        Registry { time_offset_secs: 3600, retx_timeout_secs: 300 }
    }
}

/// What a [`RefServer`] is made of.
#[derive(Clone, Copy, Debug)]
pub struct RefConfig<'a> {
    /// Its name (its directory's under the root).
    pub name: &'a str,
    /// The namespace it runs in.
    pub host: &'a Host,
    /// Its LDM port.
    pub port: u16,
    /// The text of its `ldmd.conf`.
    pub ldmd_conf: &'a str,
    /// Its queue's size (`pqcreate -s`, e.g. "500M").
    pub queue_size: &'a str,
    /// Its queue's product slots (`pqcreate -S`; `None`: LDM's default, the size over an average
    /// product of about 140 KB — too few for a queue of small products).
    pub slots: Option<u64>,
    /// Its registry settings (the LDM-7 build).
    pub registry: &'a Registry,
}

/// One reference `ldmd` in a [`Host`]: its directory (owned by the build's user) holds the
/// queue `q.pq`, `ldmd.conf`, its registry `registry/`, the `HOME` of its processes and its log
/// `log` (`-v`, standard error: one line per product). Dropping it kills its process group.
#[derive(Debug)]
pub struct RefServer {
    reference: Reference,
    name: String,
    dir: PathBuf,
    netns: String,
    port: u16,
    mac_level: u8,
    child: Option<Child>,
}

impl RefServer {
    /// Makes the server's directory `root/<name>` with its queue, `ldmd.conf` and registry.
    /// Does not start it.
    pub fn create(reference: &Reference, root: &Path, config: RefConfig<'_>) -> Result<RefServer> {
        let RefConfig { name, host, port, ldmd_conf, queue_size, slots, registry } = config;
        let dir = root.join(name);
        reference.own(&dir)?;
        reference.own(&dir.join("registry"))?;
        std::fs::write(dir.join("ldmd.conf"), ldmd_conf).map_err(io_error("write ldmd.conf"))?;
        reference.give(&dir.join("ldmd.conf"))?;
        let server = RefServer {
            reference: reference.clone(),
            name: name.to_string(),
            dir: dir.clone(),
            netns: host.name().to_string(),
            port,
            mac_level: 0,
            child: None,
        };
        if reference.multicast {
            let template = reference.home().join("etc/registry.xml");
            let copy = dir.join("registry/registry.xml");
            std::fs::copy(&template, &copy).map_err(io_error(format!("copy {}", template.display())))?;
            reference.give(&copy)?;
            for (key, value) in [
                ("/server/time-offset", registry.time_offset_secs.to_string()),
                ("/fmtp-retx-timeout", registry.retx_timeout_secs.to_string()),
                ("/server/enable-anti-DOS", "FALSE".to_string()),
                ("/server/port", port.to_string()),
            ] {
                server.run("regutil", &["-s", &value, key])?;
            }
        }
        let slots = slots.map(|slots| slots.to_string());
        let mut args = vec!["-l", "-", "-c", "-s", queue_size, "-q", "q.pq"];
        if let Some(slots) = &slots {
            args.extend(["-S", slots.as_str()]);
        }
        server.run("pqcreate", &args)?;
        reference.give(&dir.join("q.pq"))?;
        Ok(server)
    }

    /// With this FMTP MAC level (`FMTP_MAC_LEVEL`) from the next start.
    pub fn mac_level(&mut self, level: u8) -> &mut Self {
        self.mac_level = level;
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its queue.
    pub fn queue_path(&self) -> PathBuf {
        self.dir.join("q.pq")
    }

    /// Starts `ldmd` (in the foreground, logging to `log`) and waits until it listens.
    pub fn start(&mut self) -> Result<()> {
        use std::os::unix::process::CommandExt;
        if self.child.is_some() {
            return Err(self.failure("start asked while it is running"));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("log"))
            .map_err(io_error("open the log"))?;
        let mut command = self.reference.command(Some(&self.netns), &self.dir, "ldmd", &self.environment());
        command
            .args(["-v", "-l", "-", "-q", "q.pq", "-P", &self.port.to_string(), "ldmd.conf"])
            .current_dir(&self.dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let started = self.log().matches("Starting Up").count();
        let child = command.spawn().map_err(io_error("start ldmd"))?;
        let pid = child.id();
        self.child = Some(child);
        let port = self.port;
        // Without ALLOW or ACCEPT entries the reference serves no port: then it has started
        // once it says so.
        let conf = std::fs::read_to_string(self.dir.join("ldmd.conf")).unwrap_or_default();
        let serves = conf.lines().any(|line| line.starts_with("ALLOW") || line.starts_with("ACCEPT"));
        wait_for(START_TIMEOUT, &format!("{} to start (port {port})", self.name), || {
            if let Some(status) = self.try_wait()? {
                return Err(self.failure(&format!("exited with {status} while starting")));
            }
            Ok(if serves {
                crate::server::listening(pid, port).then_some(())
            } else {
                (self.log().matches("Starting Up").count() > started).then_some(())
            })
        })
    }

    /// SIGTERM to `ldmd` (it ends its process group) and waits for it.
    pub fn stop(&mut self) -> Result<()> {
        self.stop_within(STOP_TIMEOUT)
    }

    /// SIGTERM, then SIGKILL to the process group after `timeout` (or once `ldmd` exited).
    fn stop_within(&mut self, timeout: Duration) -> Result<()> {
        let Some(pid) = self.pid() else { return Ok(()) };
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let result = wait_for(timeout, &format!("{} to exit on SIGTERM", self.name), || self.try_wait());
        self.kill();
        result.map(|_| ())
    }

    /// SIGKILL to its whole process group (`ldmd`, its children, `mldm_sender`).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
    }

    /// The process id of `ldmd` while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Inserts `files` (relative to `dir`, which the build's user must be able to read) with
    /// `pqinsert -f feed` and wakes the server's processes (SIGCONT to its process group).
    pub fn insert(&self, dir: &Path, feed: &str, files: &[String]) -> Result<()> {
        let queue = self.queue_path();
        let mut command = self.reference.command(None, &self.dir, "pqinsert", &[]);
        command.args(["-l", "-", "-f", feed, "-q"]).arg(&queue).args(files).current_dir(dir).stdin(Stdio::null());
        let output = command.output().map_err(io_error("run pqinsert"))?;
        if !output.status.success() {
            return Err(
                self.failure(&format!("pqinsert failed: {}", tail(&String::from_utf8_lossy(&output.stderr), 5)))
            );
        }
        self.wake();
        Ok(())
    }

    /// SIGCONT to the server's process group: its upstreams look at the queue again.
    pub fn wake(&self) {
        if let Some(pid) = self.pid() {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGCONT);
        }
    }

    /// Its log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Every product of its queue.
    pub fn held(&self) -> Result<Vec<Held>> {
        self.reference.held(&self.dir, &self.queue_path())
    }

    /// The build it runs.
    pub fn reference(&self) -> &Reference {
        &self.reference
    }

    /// Waits until its queue holds `count` products.
    pub fn wait_for_products(&mut self, count: usize, timeout: Duration) -> Result<()> {
        let what = format!("{} to hold {count} products", self.name);
        let result = wait_for(timeout, &what, || {
            if let Some(status) = self.try_wait()? {
                return Err(self.failure(&format!("exited with {status}")));
            }
            Ok((self.held()?.len() >= count).then_some(()))
        });
        result.map_err(|error| match error {
            TestbedError::Timeout { .. } => {
                let have = self.held().map(|held| held.len()).unwrap_or(0);
                self.failure(&format!("{error} (it holds {have})"))
            }
            other => other,
        })
    }

    /// The last lines of its log, for a failure message.
    pub fn failure(&self, what: &str) -> TestbedError {
        TestbedError::Server { server: self.name.clone(), what: what.to_string(), log_tail: tail(&self.log(), 30) }
    }

    fn environment(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("LDM_REGISTRY_DIR", self.dir.join("registry").display().to_string())];
        if self.reference.multicast {
            env.push(("FMTP_MAC_LEVEL", self.mac_level.to_string()));
        }
        env
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<Vec<u8>> {
        let mut command = self.reference.command(None, &self.dir, program, &self.environment());
        command.args(args).current_dir(&self.dir).stdin(Stdio::null());
        let output = command.output().map_err(io_error(format!("run {program}")))?;
        if !output.status.success() {
            return Err(self.failure(&format!(
                "{program} {}: {}",
                args.join(" "),
                tail(&String::from_utf8_lossy(&output.stderr), 5)
            )));
        }
        Ok(output.stdout)
    }

    fn try_wait(&mut self) -> Result<Option<std::process::ExitStatus>> {
        match self.child.as_mut() {
            None => Ok(None),
            Some(child) => {
                let status = child.try_wait().map_err(io_error(format!("wait for {}", self.name)))?;
                if status.is_some() {
                    self.child = None;
                }
                Ok(status)
            }
        }
    }
}

impl Drop for RefServer {
    fn drop(&mut self) {
        // Stopped, not killed: `ldmd` deletes its shared-memory database (System V, keyed by
        // `ftok` of the queue's path) as it exits; one left behind is found again by a later
        // queue that reuses the inode, and its owner's permissions refuse that server's start.
        let _ = self.stop_within(DROP_STOP_TIMEOUT);
        // The session memory of its RECEIVE entries (`<host>:<port>_<feed>.yaml`, in the
        // build's compiled-in log directory): the files naming a port of this server's
        // upstreams would be read by a later server on the same port.
        if self.reference.multicast {
            let conf = std::fs::read_to_string(self.dir.join("ldmd.conf")).unwrap_or_default();
            let logs = self.reference.home().join("var/logs");
            for upstream in conf.lines().filter_map(|line| line.strip_prefix("RECEIVE")) {
                let Some(server) = upstream.split_whitespace().nth(1) else { continue };
                let Ok(entries) = std::fs::read_dir(&logs) else { continue };
                for entry in entries.flatten() {
                    let file = entry.file_name().to_string_lossy().into_owned();
                    if file.starts_with(&format!("{server}_")) && file.ends_with(".yaml") {
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
            }
        }
    }
}

/// A product's delivery at a subscriber, as its log says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedDelivery {
    /// How it came.
    pub mode: DeliveryMode,
    /// Blocks repaired over TCP (FMTP deliveries).
    pub retransmitted_blocks: Option<u32>,
    /// The product's printed metadata.
    pub info: String,
}

/// The deliveries a subscriber's log records, in order: ldm7's lines (`Received: {latency: …,
/// info: "…"}`) and the reference's (`Received: {delay: …, info: "…"}`, `Inserted: <info>`,
/// `Backlog: <info>`).
pub fn deliveries(log: &str) -> Vec<LoggedDelivery> {
    let mut found = Vec::new();
    for line in log.lines() {
        if let Some(line) = crate::records::DeliveryLine::parse(line) {
            found.push(LoggedDelivery {
                mode: line.mode,
                retransmitted_blocks: line.retransmitted_blocks,
                info: line.info.to_string(),
            });
            continue;
        }
        if let Some(rest) = after(line, " Received: {delay: ") {
            let retransmitted_blocks =
                rest.split_once("retrans: ").and_then(|(_, r)| r.split(',').next()).and_then(|r| r.trim().parse().ok());
            if let Some(info) = rest.split_once("info: \"").and_then(|(_, info)| info.strip_suffix("\"}")) {
                found.push(LoggedDelivery {
                    mode: DeliveryMode::Received,
                    retransmitted_blocks,
                    info: info.to_string(),
                });
            }
        } else if let Some(info) = after(line, " Inserted: ").filter(|info| is_info(info)) {
            found.push(LoggedDelivery {
                mode: DeliveryMode::Inserted,
                retransmitted_blocks: None,
                info: info.to_string(),
            });
        } else if let Some(info) = after(line, " Backlog: ").filter(|info| is_info(info)) {
            found.push(LoggedDelivery {
                mode: DeliveryMode::Backlog,
                retransmitted_blocks: None,
                info: info.to_string(),
            });
        }
    }
    found
}

/// The text after the last `marker` in `line`. Not only after an INFO prefix: the
/// reference's processes share one standard error and write a line's prefix and message
/// separately, so another line's prefix sometimes lands between them.
fn after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let at = line.rfind(marker.trim_start())?;
    Some(&line[at + marker.trim_start().len()..])
}

/// Whether `text` is a printed product metadata (`      5000 20261127171533.292277 EXP 000 …`).
fn is_info(text: &str) -> bool {
    text.split_whitespace().next().is_some_and(|size| size.bytes().all(|b| b.is_ascii_digit()))
}

/// What a publisher's log says it sent, by product (printed metadata).
#[derive(Clone, Debug, Default)]
pub struct Sent {
    /// Products multicast, with their FMTP index.
    pub multicast: HashMap<String, u32>,
    /// Products sent through the backstop (`Missed product sent`), how many times.
    pub missed: HashMap<String, usize>,
    /// Products sent in backlogs, how many times.
    pub backlog: HashMap<String, usize>,
}

/// Reads a publisher's log (either system: the same lines).
pub fn sent(log: &str) -> Sent {
    let mut sent = Sent::default();
    for line in log.lines() {
        if let Some(rest) = after(line, " Multicasted: prodIndex=") {
            let Some((index, info)) = rest.split_once(", prodInfo=\"") else { continue };
            if let (Ok(index), Some(info)) = (index.parse(), info.strip_suffix('"')) {
                sent.multicast.insert(info.to_string(), index);
            }
        } else if let Some(rest) = after(line, " Missed product sent: index=") {
            if let Some(info) = rest.split_once(", info=\"").and_then(|(_, info)| info.strip_suffix('"')) {
                *sent.missed.entry(info.to_string()).or_default() += 1;
            }
        } else if let Some(info) = after(line, " Backlog product sent: ") {
            *sent.backlog.entry(info.to_string()).or_default() += 1;
        }
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_systems_delivery_lines_read_alike() {
        let log = "\
20261127T171533.305744Z ldmd[25536]   MldmRcvr.c:eop_func:258   INFO  Received: {delay: 0.0009361 s, index: 0, retrans: 1, info: \"      5000 20261127171533.292277 EXP 000  f1\"}
20261127T171533.305744Z ldmd[25536]   down7.c:downlet_recvProd:2262   INFO  Inserted:       5000 20261127171533.292277 EXP 001  f2
20261127T171533.305744Z ldmd[25536]   down7.c:downlet_recvProd:2262   INFO  Backlog:       5000 20261127171533.292277 EXP 002  f3
20261123T115936.301490Z ldm7[22800] INFO Received: {latency: 15714 µs, index: 3, retrans: 7, info: \"      5000 20261127171533.292277 EXP 003  f4\"}
20261123T115936.301490Z ldm7[22800] INFO Backlog: {latency: 15714 µs, index: -, retrans: -, info: \"      5000 20261127171533.292277 EXP 004  f5\"}
20261123T115936.301490Z ldm7[22800] WARN Inserted: not a delivery
x mldm_sender[1] mldm_sender.c:mls_mcastProd:662 x ldmd[2]  up7.c:deliverProduct:612 Backlog:     17 20261127173640.934151 EXP 006  f6
";
        let found = deliveries(log);
        let summary: Vec<(DeliveryMode, Option<u32>, &str)> = found
            .iter()
            .map(|d| (d.mode, d.retransmitted_blocks, d.info.rsplit(' ').next().unwrap_or_default()))
            .collect();
        use DeliveryMode::{Backlog, Inserted, Received};
        assert_eq!(
            summary,
            [
                (Received, Some(1), "f1"),
                (Inserted, None, "f2"),
                (Backlog, None, "f3"),
                (Received, Some(7), "f4"),
                (Backlog, None, "f5"),
                (Backlog, None, "f6")
            ]
        );
        let sent = sent("\
x mldm_sender[1] mldm_sender.c:mls_mcastProd:662 INFO  Multicasted: prodIndex=4, prodInfo=\"  5 20261127171533.292516 EXP 004  f5\"
x ldm7[2] INFO Missed product sent: index=4, info=\"  5 20261127171533.292516 EXP 004  f5\"
x ldm7[2] INFO Backlog product sent:   5 20261127171533.292516 EXP 004  f5
");
        assert_eq!(sent.multicast.get("  5 20261127171533.292516 EXP 004  f5"), Some(&4));
        assert_eq!(sent.missed.values().sum::<usize>(), 1);
        assert_eq!(sent.backlog.values().sum::<usize>(), 1);
    }
}
