//! The `static` driver: paths provisioned by someone else (a campus VLAN, a long-lived AL2S
//! circuit). It checks every request against what was provisioned and changes nothing.

use std::collections::BTreeMap;

use super::{Endpoint, Leg, PathError, PathInfo, PathService};
use ldm7_types::units::Rate;

/// One pre-provisioned path.
#[derive(Debug, Clone, PartialEq)]
pub struct StaticPath {
    /// Its provisioned rate (the most a request may ask for).
    pub rate: Rate,
    /// The endpoints it reaches.
    pub endpoints: Vec<Endpoint>,
}

/// Pre-provisioned paths, by feed name.
#[derive(Debug, Default)]
pub struct StaticPaths {
    provisioned: BTreeMap<String, StaticPath>,
    active: BTreeMap<String, (Rate, Vec<Endpoint>)>,
}

impl StaticPaths {
    /// A driver over the given provisioned paths.
    pub fn new(provisioned: impl IntoIterator<Item = (String, StaticPath)>) -> StaticPaths {
        StaticPaths { provisioned: provisioned.into_iter().collect(), active: BTreeMap::new() }
    }

    fn provisioned(&self, name: &str) -> Result<&StaticPath, PathError> {
        self.provisioned.get(name).ok_or_else(|| PathError::NotProvisioned {
            name: name.to_string(),
            provisioned: self.provisioned.keys().cloned().collect(),
        })
    }

    fn check_rate(&self, name: &str, rate: Rate) -> Result<(), PathError> {
        let provisioned = self.provisioned(name)?;
        if rate > provisioned.rate {
            return Err(PathError::AboveProvisionedRate {
                name: name.to_string(),
                provisioned: provisioned.rate,
                requested: rate,
            });
        }
        Ok(())
    }
}

impl PathService for StaticPaths {
    fn driver(&self) -> &'static str {
        "static"
    }

    fn create_path(&mut self, name: &str, rate: Rate) -> Result<(), PathError> {
        self.check_rate(name, rate)?;
        if self.active.contains_key(name) {
            return Err(PathError::PathExists(name.to_string()));
        }
        self.active.insert(name.to_string(), (rate, Vec::new()));
        Ok(())
    }

    fn add_leg(&mut self, name: &str, leg: &Leg) -> Result<(), PathError> {
        if leg.is_impaired() {
            return Err(PathError::ImpairmentUnsupported { driver: self.driver(), endpoint: leg.endpoint.clone() });
        }
        let provisioned = self.provisioned(name)?;
        if !provisioned.endpoints.contains(&leg.endpoint) {
            return Err(PathError::NotReached {
                name: name.to_string(),
                endpoint: leg.endpoint.clone(),
                reaches: provisioned.endpoints.iter().map(ToString::to_string).collect(),
            });
        }
        let (_, legs) = self.active.get_mut(name).ok_or_else(|| PathError::NoSuchPath(name.to_string()))?;
        if !legs.contains(&leg.endpoint) {
            legs.push(leg.endpoint.clone());
        }
        Ok(())
    }

    fn remove_leg(&mut self, name: &str, endpoint: &Endpoint) -> Result<(), PathError> {
        let (_, legs) = self.active.get_mut(name).ok_or_else(|| PathError::NoSuchPath(name.to_string()))?;
        let before = legs.len();
        legs.retain(|e| e != endpoint);
        if legs.len() == before {
            return Err(PathError::NoSuchLeg { path: name.to_string(), endpoint: endpoint.clone() });
        }
        Ok(())
    }

    fn set_rate(&mut self, name: &str, rate: Rate) -> Result<(), PathError> {
        self.check_rate(name, rate)?;
        let (current, _) = self.active.get_mut(name).ok_or_else(|| PathError::NoSuchPath(name.to_string()))?;
        *current = rate;
        Ok(())
    }

    fn list(&mut self) -> Result<Vec<PathInfo>, PathError> {
        Ok(self
            .active
            .iter()
            .map(|(name, (rate, legs))| PathInfo {
                name: name.clone(),
                rate: *rate,
                legs: legs.clone(),
                detail: format!("static, provisioned at {}", self.provisioned[name].rate),
            })
            .collect())
    }

    fn remove_path(&mut self, name: &str) -> Result<(), PathError> {
        self.active.remove(name);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths() -> StaticPaths {
        StaticPaths::new([(
            "ngrid".to_string(),
            StaticPath {
                rate: Rate::from_megabits_per_s(100),
                endpoints: vec![Endpoint::new("sw1", "et-1/0/0"), Endpoint::new("sw2", "et-2/0/0")],
            },
        )])
    }

    #[test]
    fn validates_against_what_was_provisioned() {
        let mut paths = paths();
        assert!(paths.create_path("conduit", Rate::from_megabits_per_s(10)).is_err());
        assert!(paths.create_path("ngrid", Rate::from_megabits_per_s(200)).is_err());
        paths.create_path("ngrid", Rate::from_megabits_per_s(40)).unwrap();
        paths.add_leg("ngrid", &Leg::plain(Endpoint::new("sw1", "et-1/0/0"))).unwrap();
        paths.add_leg("ngrid", &Leg::plain(Endpoint::new("sw1", "et-1/0/0"))).unwrap();
        assert!(paths.add_leg("ngrid", &Leg::plain(Endpoint::new("sw9", "x"))).is_err());
        assert_eq!(paths.list().unwrap()[0].legs.len(), 1);
        paths.remove_leg("ngrid", &Endpoint::new("sw1", "et-1/0/0")).unwrap();
        assert!(paths.remove_leg("ngrid", &Endpoint::new("sw1", "et-1/0/0")).is_err());
        assert!(paths.set_rate("ngrid", Rate::from_megabits_per_s(101)).is_err());
        paths.set_rate("ngrid", Rate::from_megabits_per_s(100)).unwrap();
        paths.remove_path("ngrid").unwrap();
        assert!(paths.list().unwrap().is_empty());
    }
}
