//! A lab for the length of a test or a benchmark run: brought up from a spec, taken down when
//! the value is dropped (a failed `up` removes what it made by itself, `ldm7_net::lab::up`).

use std::net::Ipv4Addr;

use ldm7_net::command::Cmd;
use ldm7_net::lab::{self, LabSpec};

use crate::{Result, TestbedError};

/// A lab that is up; dropping it takes it down (errors while dropping are ignored: use
/// [`Lab::down`] to see them).
#[derive(Debug)]
pub struct Lab {
    spec: LabSpec,
    up: bool,
}

impl Lab {
    /// Brings the lab of `spec_toml` (the `ldm7 lab` spec format, docs/lab.md) up. A lab of
    /// the same name left over from an earlier run is taken down first.
    pub fn up(spec_toml: &str) -> Result<Lab> {
        let spec = LabSpec::from_toml_str(spec_toml)?;
        let leftover = lab::LabState::read(&spec.name).is_some()
            || spec.namespaces().iter().any(|name| ldm7_net::netns::exists(name));
        if leftover {
            lab::down_spec(&spec)?;
        }
        lab::up(&spec, spec_toml)?;
        Ok(Lab { spec, up: true })
    }

    /// The lab's spec.
    pub fn spec(&self) -> &LabSpec {
        &self.spec
    }

    /// The lab's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The namespace of `host` ([`TestbedError::NoSuchHost`] when the lab has none).
    pub fn netns(&self, host: &str) -> Result<String> {
        self.check_host(host)?;
        Ok(self.spec.netns_of(host))
    }

    /// `host`'s address on the control network (`ctl`).
    pub fn control_address(&self, host: &str) -> Result<Ipv4Addr> {
        self.spec.control_address_of(host).map(|cidr| cidr.address).ok_or_else(|| self.no_such_host(host))
    }

    /// The address `host` is reached at on the control network: its IPv4 address when it has
    /// IPv4, else its IPv6 one.
    pub fn control_ip(&self, host: &str) -> Result<std::net::IpAddr> {
        self.spec.control_ip_of(host).ok_or_else(|| self.no_such_host(host))
    }

    /// Runs `program args…` inside `host` and returns its standard output.
    pub fn exec(&self, host: &str, program: &str, args: &[&str]) -> Result<String> {
        let netns = self.netns(host)?;
        Ok(Cmd::new(program).netns(Some(&netns)).args(args.iter().copied()).run()?)
    }

    /// Takes the lab down now and reports a failure.
    pub fn down(mut self) -> Result<()> {
        self.up = false;
        lab::down(&self.spec.name)?;
        Ok(())
    }

    fn check_host(&self, host: &str) -> Result<()> {
        if self.spec.host(host).is_some() { Ok(()) } else { Err(self.no_such_host(host)) }
    }

    fn no_such_host(&self, host: &str) -> TestbedError {
        TestbedError::NoSuchHost { lab: self.spec.name.clone(), host: host.to_string() }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.up {
            let _ = lab::down(&self.spec.name);
        }
    }
}
