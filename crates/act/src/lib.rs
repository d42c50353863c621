//! Product actions as `pqact` runs them (ldm-formats.md §2): a `pqact.conf` of entries, each a
//! feedtype, an identifier pattern and an action (FILE, STDIOFILE, DBFILE, PIPE, EXEC, NOOP)
//! whose arguments are expanded per product.
//!
//! [`conf`] parses a configuration, [`subst`] makes the substitutions, and [`Conf::matching`]
//! picks the entries a product runs, in file order.

pub mod conf;
pub mod edex;
pub mod output;
pub mod outputs;
pub mod pipe;
pub mod run;
pub mod state;
pub mod subst;

pub use conf::{Action, ActionKind, Conf, ConfError, Entry, EntryPattern, Options, Source, parse, split_args};
pub use subst::{Matched, expand};

use ldm7_types::ProdInfo;

impl Conf {
    /// The entries `info` runs, in file order, each with what its pattern matched: every entry
    /// whose feedtype intersects the product's and whose pattern matches its identifier; an
    /// `^_ELSE_$` entry only when no entry before it matched and the identifier does not start
    /// with `_`.
    pub fn matching<'c>(&'c self, info: &ProdInfo) -> Vec<(&'c Entry, Matched)> {
        let mut chosen = Vec::new();
        let mut matched_before = false;
        for entry in &self.entries {
            if !entry.feed.intersects(info.feedtype) {
                continue;
            }
            match &entry.pattern {
                EntryPattern::Else => {
                    if !matched_before && !info.ident.starts_with('_') {
                        chosen.push((entry, Matched { groups: vec![Some(0..info.ident.len())] }));
                        matched_before = true;
                    }
                }
                EntryPattern::Ere(pattern) => {
                    if let Some(groups) = pattern.captures(&info.ident) {
                        chosen.push((entry, Matched { groups }));
                        matched_before = true;
                    }
                }
            }
        }
        chosen
    }
}

/// The expanded arguments of `entry`'s action for a product: substitutions, then split.
pub fn arguments(entry: &Entry, info: &ProdInfo, matched: &Matched) -> Vec<String> {
    split_args(&expand(&entry.action.args, &info.ident, matched, info.arrival, info.seqno))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ldm7_types::{FeedType, Signature, Timestamp};

    fn product(feed: &str, ident: &str) -> ProdInfo {
        ProdInfo {
            arrival: "20261123180509".parse::<Timestamp>().expect("time"),
            signature: Signature([7; 16]),
            origin: "here".into(),
            feedtype: feed.parse::<FeedType>().expect("feed"),
            seqno: 9,
            ident: ident.into(),
            size: 10,
        }
    }

    #[test]
    fn every_matching_entry_runs_and_else_only_when_none_did() {
        let conf = parse(
            "p",
            "WMO\t^SAUS\tFILE\ta/\\0\n\
             IDS|DDPLUS\t^(SA)(US)\tFILE\tb/\\2\\1\n\
             WMO\t^_ELSE_$\tFILE\tother/&\n\
             NEXRAD3\t.*\tNOOP\n",
        )
        .expect("valid");
        let names = |info: &ProdInfo| -> Vec<Vec<String>> {
            conf.matching(info).iter().map(|(entry, matched)| arguments(entry, info, matched)).collect()
        };
        assert_eq!(names(&product("IDS", "SAUS43 KWBC")), [vec!["a/SAUS".to_owned()], vec!["b/USSA".to_owned()]]);
        assert_eq!(names(&product("HDS", "YHWA KWBC")), [vec!["other/YHWA".to_owned(), "KWBC".to_owned()]]);
        assert!(names(&product("HDS", "_internal")).is_empty());
        assert!(names(&product("NEXRAD3", "SAUS")).len() == 1);
    }
}
