//! Where nodes are, for the map: a TOML file of `[[node]]` tables.
//!
//! ```toml
//! [[node]]
//! name = "idd.unidata.ucar.edu"   # as the node names itself in its statistics (host, or host:port)
//! latitude = 40.04
//! longitude = -105.25
//! ```

use std::path::Path;

/// One node's place.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodePlace {
    /// Its name.
    pub name: String,
    /// Degrees north.
    pub latitude: f64,
    /// Degrees east (negative in the Americas).
    pub longitude: f64,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    node: Vec<NodePlace>,
}

/// The file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct NodesError {
    path: String,
    message: String,
}

/// Reads a nodes file.
pub fn read(path: &Path) -> Result<Vec<NodePlace>, NodesError> {
    let error = |message: String| NodesError { path: path.display().to_string(), message };
    let text = std::fs::read_to_string(path).map_err(|source| error(source.to_string()))?;
    let file: File = toml::from_str(&text).map_err(|source| error(source.to_string()))?;
    for node in &file.node {
        if !(-90.0..=90.0).contains(&node.latitude) || !(-180.0..=180.0).contains(&node.longitude) {
            return Err(error(format!("{}: latitude must be in [-90, 90] and longitude in [-180, 180]", node.name)));
        }
    }
    Ok(file.node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_reads_and_bad_places_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("nodes.toml");
        std::fs::write(&path, "[[node]]\nname = \"a\"\nlatitude = 40.0\nlongitude = -105.25\n").expect("write");
        assert_eq!(read(&path).expect("read"), [NodePlace { name: "a".into(), latitude: 40.0, longitude: -105.25 }]);
        std::fs::write(&path, "[[node]]\nname = \"a\"\nlatitude = 140.0\nlongitude = 0.0\n").expect("write");
        assert!(read(&path).unwrap_err().to_string().contains("latitude must be"));
        std::fs::write(&path, "[[node]]\nname = \"a\"\nlat = 1.0\n").expect("write");
        assert!(read(&path).unwrap_err().to_string().contains("nodes.toml"));
    }
}
