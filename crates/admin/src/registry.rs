//! LDM's registry (`registry.xml`, ldm-formats.md §6): nested elements whose paths name the
//! parameters (`/queue/size`), read into a map.

use std::collections::BTreeMap;
use std::path::Path;

use crate::AdminError;

/// The parameters of a registry: `/queue/path` → its text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registry {
    values: BTreeMap<String, String>,
}

impl Registry {
    /// Reads a registry file.
    pub fn load(path: &Path) -> Result<Self, AdminError> {
        let text = std::fs::read_to_string(path).map_err(AdminError::io(path))?;
        Self::parse(&text).map_err(|error| AdminError::Other(format!("{}: {error}", path.display())))
    }

    /// Parses a registry's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let document = roxmltree::Document::parse(text).map_err(|error| format!("not XML: {error}"))?;
        let root = document.root_element();
        if root.tag_name().name() != "registry" {
            return Err(format!("the root element is <{}>, not <registry>", root.tag_name().name()));
        }
        let mut values = BTreeMap::new();
        collect(root, "", &mut values);
        Ok(Self { values })
    }

    /// A parameter's text (trimmed), if set.
    pub fn get(&self, path: &str) -> Option<&str> {
        self.values.get(path).map(String::as_str).filter(|value| !value.is_empty())
    }

    /// Every parameter, in path order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(path, value)| (path.as_str(), value.as_str()))
    }
}

fn collect(node: roxmltree::Node<'_, '_>, prefix: &str, values: &mut BTreeMap<String, String>) {
    for child in node.children().filter(roxmltree::Node::is_element) {
        let path = format!("{prefix}/{}", child.tag_name().name());
        if child.children().any(|grandchild| grandchild.is_element()) {
            collect(child, &path, values);
        } else {
            values.insert(path, child.text().unwrap_or("").trim().to_owned());
        }
    }
}

/// LDM's boolean values (`1`, `TRUE`, `true`…).
pub fn truthy(text: &str) -> bool {
    matches!(text.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_elements_become_paths() {
        let registry = Registry::parse(
            "<?xml version=\"1.0\"?>\n<registry>\n  <hostname>vm</hostname>\n  <queue>\n    <path>/q/ldm.pq</path>\n    \
             <size>500M</size>\n  </queue>\n  <check-time>\n    <ntpdate>\n      <servers>a b</servers>\n    </ntpdate>\n  \
             </check-time>\n  <server><enable-anti-DOS>FALSE</enable-anti-DOS></server>\n</registry>\n",
        )
        .expect("parse");
        assert_eq!(registry.get("/hostname"), Some("vm"));
        assert_eq!(registry.get("/queue/path"), Some("/q/ldm.pq"));
        assert_eq!(registry.get("/queue/size"), Some("500M"));
        assert_eq!(registry.get("/check-time/ntpdate/servers"), Some("a b"));
        assert!(!truthy(registry.get("/server/enable-anti-DOS").unwrap()));
        assert!(Registry::parse("<other/>").is_err());
        assert!(Registry::parse("<registry>").is_err());
    }
}
