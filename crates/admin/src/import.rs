//! `ldm7 import LDMHOME`: an existing LDM installation into an ldm7 home that runs the same feeds
//! and actions — the registry's settings into `etc/ldm7.toml`, ldmd.conf (and what it INCLUDEs),
//! the pqact and scour configurations copied unchanged, the REQUESTs' resume points (LDM's
//! `.<md5>.info` files) under ldm7's names, and `bin/` links for the classic program names —
//! with a report of what was carried, changed and left out, and why.
//!
//! A file is written only when absent; one that differs from what the import would write is
//! kept and reported (an operator's edits are not undone), so running the import twice changes
//! nothing the second time.

use std::path::{Path, PathBuf};

use ldm7_config::ldmd::Config;
use md5::{Digest, Md5};

use crate::AdminError;
use crate::registry::{Registry, truthy};

/// The classic program names linked in the new home's `bin/` (what EXEC entries run).
pub const CLASSIC_NAMES: &[&str] = &[
    "ldmadmin", "ldmd", "pqact", "pqinsert", "pqcat", "pqcreate", "pqmon", "pqcheck", "notifyme", "ldmsend", "scour",
    "rtstats",
];

/// What an import did.
#[derive(Debug, Default)]
pub struct ImportReport {
    /// Carried over as it was.
    pub carried: Vec<String>,
    /// Carried over with a change, and why.
    pub changed: Vec<String>,
    /// Not carried over, and why.
    pub left_out: Vec<String>,
    /// Files written (none on a second run).
    pub written: Vec<PathBuf>,
    /// Files already there and different from what the import would write: kept.
    pub kept: Vec<PathBuf>,
}

impl std::fmt::Display for ImportReport {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (title, items) in [("carried", &self.carried), ("changed", &self.changed), ("left out", &self.left_out)] {
            writeln!(formatter, "{title} ({}):", items.len())?;
            for item in items {
                writeln!(formatter, "  {item}")?;
            }
        }
        if self.written.is_empty() {
            writeln!(formatter, "written: nothing (everything was there already)")?;
        } else {
            writeln!(formatter, "written ({}):", self.written.len())?;
            for file in &self.written {
                writeln!(formatter, "  {}", file.display())?;
            }
        }
        for file in &self.kept {
            writeln!(
                formatter,
                "kept (differs from what the import would write; remove it to regenerate): {}",
                file.display()
            )?;
        }
        Ok(())
    }
}

/// Where an import reads and writes.
#[derive(Clone, Debug)]
pub struct ImportPlan {
    /// The LDM home (LDMHOME: ldmd's working directory, where its `.info` files are).
    pub ldm_home: PathBuf,
    /// Its registry (default `LDMHOME/etc/registry.xml`).
    pub registry: PathBuf,
    /// The new ldm7 home.
    pub home: PathBuf,
    /// The `ldm7` executable the classic names link to.
    pub exe: PathBuf,
}

/// Imports the LDM home of `plan` into its ldm7 home.
pub fn import(plan: &ImportPlan) -> Result<ImportReport, AdminError> {
    let registry = Registry::load(&plan.registry)?;
    let mut report = ImportReport::default();
    let home = std::path::absolute(&plan.home).map_err(AdminError::io(&plan.home))?;
    if home == std::path::absolute(&plan.ldm_home).map_err(AdminError::io(&plan.ldm_home))? {
        return Err(AdminError::Other(
            "the ldm7 home must be another directory than the LDM home (its bin/ holds LDM's programs)".into(),
        ));
    }
    let ldm_path = |key: &str, default: &str| -> PathBuf {
        let path = PathBuf::from(registry.get(key).unwrap_or(default));
        if path.is_absolute() { path } else { plan.ldm_home.join(path) }
    };
    for dir in ["etc", "bin", "var/queues", "var/logs"] {
        std::fs::create_dir_all(home.join(dir)).map_err(AdminError::io(&home.join(dir)))?;
    }

    // ldmd.conf, and what it INCLUDEs (relative paths stay relative to the copy).
    let ldmd_conf = ldm_path("/server/config-path", "etc/ldmd.conf");
    let config = Config::load(&ldmd_conf).map_err(|error| AdminError::Other(format!("the LDM home's {error}")))?;
    let new_ldmd_conf = home.join("etc/ldmd.conf");
    let (text, notes) = translate_ldmd_conf(&std::fs::read_to_string(&ldmd_conf).map_err(AdminError::io(&ldmd_conf))?);
    write_new(&new_ldmd_conf, text.as_bytes(), &mut report)?;
    report.carried.push(format!(
        "{}: {} ALLOW, {} ACCEPT, {} REQUEST, {} EXEC, {} MULTICAST, {} RECEIVE → {}",
        ldmd_conf.display(),
        config.allows.len(),
        config.accepts.len(),
        config.requests.len(),
        config.execs.len(),
        config.multicasts.len(),
        config.receives.len(),
        new_ldmd_conf.display()
    ));
    for note in notes {
        report.left_out.push(note);
    }
    for exec in &config.execs {
        let program = exec.argv.first().and_then(|first| Path::new(first).file_name()).and_then(|name| name.to_str());
        let Some(program) = program else { continue };
        if unsupported_program(program).is_some() {
            continue;
        }
        let how = if CLASSIC_NAMES.contains(&program) {
            format!("ldm7's {program} (bin/{program})")
        } else {
            "the same program, found on PATH as before".to_owned()
        };
        report.carried.push(format!("EXEC \"{}\": runs {how}", exec.argv.join(" ")));
    }
    for include in included_files(&ldmd_conf) {
        if let Ok(relative) = include.strip_prefix(ldmd_conf.parent().unwrap_or(Path::new("."))) {
            let target = home.join("etc").join(relative);
            copy_new(&include, &target, &mut report)?;
            report.carried.push(format!("INCLUDEd {} → {}", include.display(), target.display()));
        } else {
            report.carried.push(format!("INCLUDEd {} (an absolute path: read where it is)", include.display()));
        }
    }

    // The pqact configurations: the registry's default, and the files EXEC entries name relative
    // to LDMHOME (copied to the same place under the new home).
    let pqact_conf = ldm_path("/pqact/config-path", "etc/pqact.conf");
    let new_pqact_conf = home.join("etc/pqact.conf");
    if pqact_conf.is_file() {
        copy_new(&pqact_conf, &new_pqact_conf, &mut report)?;
        report.carried.push(format!("{} → {} (unchanged)", pqact_conf.display(), new_pqact_conf.display()));
    }
    for exec in &config.execs {
        for file in crate::pqact::pqact_arguments(&exec.argv).unwrap_or_default() {
            let source = plan.ldm_home.join(&file);
            let target = home.join(&file);
            if Path::new(&file).is_relative() && source.is_file() && target != new_pqact_conf {
                copy_new(&source, &target, &mut report)?;
                report.carried.push(format!("{} → {} (unchanged)", source.display(), target.display()));
            }
        }
    }
    let scour_conf = ldm_path("/scour/config-path", "etc/scour.conf");
    let new_scour_conf = home.join("etc/scour.conf");
    if scour_conf.is_file() {
        copy_new(&scour_conf, &new_scour_conf, &mut report)?;
        report.carried.push(format!(
            "{} → {} (unchanged; run `ldm7 admin scour` from cron as `ldmadmin scour` was)",
            scour_conf.display(),
            new_scour_conf.display()
        ));
    }

    // The settings.
    let (toml, mut notes) = settings_toml(&registry, plan, &home);
    report.changed.append(&mut notes.changed);
    report.carried.append(&mut notes.carried);
    report.left_out.append(&mut notes.left_out);
    write_new(&home.join("etc/ldm7.toml"), toml.as_bytes(), &mut report)?;

    // The resume points.
    for request in &config.requests {
        let port = request.port.unwrap_or(ldm_port(&registry));
        let class = request.class();
        let specs: Vec<(u32, &str)> =
            class.specs.iter().map(|spec| (spec.feedtype.bits(), spec.pattern.as_str())).collect();
        let ldm_name = ldm_info_name(&request.host, port, &specs);
        let described =
            format!("REQUEST {} \"{}\" {}:{port}", request.feedtype, request.pattern.as_str(), request.host);
        let source = plan.ldm_home.join(&ldm_name);
        match std::fs::read_to_string(&source).ok().and_then(|text| info_signature(&text)) {
            Some(signature) => {
                let target = home.join(ldm7_info_name(&request.host, port, &specs));
                write_new(&target, format!("{signature}\n").as_bytes(), &mut report)?;
                report.carried.push(format!(
                    "{described}: resumes after product {signature} ({} → {})",
                    source.display(),
                    target.display()
                ));
            }
            None => report.left_out.push(format!(
                "{described}: no resume point ({} absent or unreadable): it starts {} back",
                source.display(),
                registry.get("/server/time-offset").unwrap_or("3600")
            )),
        }
    }

    // The classic names.
    for name in CLASSIC_NAMES {
        let link = home.join("bin").join(name);
        match std::fs::read_link(&link) {
            Ok(target) if target == plan.exe => {}
            Ok(_) => report.kept.push(link),
            Err(_) if link.exists() => report.kept.push(link),
            Err(_) => {
                std::os::unix::fs::symlink(&plan.exe, &link).map_err(AdminError::io(&link))?;
                report.written.push(link);
            }
        }
    }
    Ok(report)
}

/// What the settings translation said.
#[derive(Default)]
struct Notes {
    carried: Vec<String>,
    changed: Vec<String>,
    left_out: Vec<String>,
}

fn ldm_port(registry: &Registry) -> u16 {
    registry.get("/server/port").and_then(|port| port.parse().ok()).unwrap_or(388)
}

/// `ldm7.toml` from a registry.
fn settings_toml(registry: &Registry, plan: &ImportPlan, home: &Path) -> (String, Notes) {
    let mut notes = Notes::default();
    let mut handled: Vec<&str> = Vec::new();
    let mut take = |key: &'static str| {
        handled.push(key);
        registry.get(key)
    };
    let quote = |text: &str| format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""));
    let mut out = format!(
        "# ldm7 settings of this site, made by `ldm7 import` from {}.\n# The site's sections are LDM's \
         registry (docs/operations.md); paths are relative to home.\n\nhome = {}\n",
        plan.registry.display(),
        quote(&home.display().to_string())
    );

    out.push_str("\n[queue]\n");
    if let Some(path) = take("/queue/path") {
        notes.changed.push(format!(
            "/queue/path {path} → var/queues/ldm.pq: LDM's queue file is not an ldm7 queue; make the new one with \
             `ldm7 admin mkqueue` (the products in LDM's queue are not carried; the REQUESTs resume after them)"
        ));
    }
    out.push_str("path = \"var/queues/ldm.pq\"\n");
    if let Some(size) = take("/queue/size") {
        out.push_str(&format!("size = {}\n", quote(size)));
        notes.carried.push(format!("/queue/size {size}"));
    }
    match take("/queue/slots") {
        Some(slots) if slots.parse::<u64>().is_ok() => {
            out.push_str(&format!("slots = {slots}\n"));
            notes.carried.push(format!("/queue/slots {slots}"));
        }
        Some(slots) => {
            out.push_str("slots = \"default\"\n");
            notes.carried.push(format!("/queue/slots {slots}"));
        }
        None => {}
    }

    out.push_str("\n[server]\n");
    out.push_str("config = \"etc/ldmd.conf\"\n");
    if let Some(path) = take("/server/config-path") {
        notes.changed.push(format!("/server/config-path {path} → etc/ldmd.conf (a copy)"));
    }
    match take("/server/ip-addr") {
        // LDM's "every address" is IPv4's; ldm7's takes IPv6 connections too.
        Some("0.0.0.0") => {
            out.push_str("listen = \"::\"\n");
            notes.changed.push(
                "/server/ip-addr 0.0.0.0 → listen \"::\" (every address, IPv6 and IPv4: LDM listens on IPv4 only; \
                 write \"0.0.0.0\" to keep it so)"
                    .into(),
            );
        }
        Some(address) => {
            out.push_str(&format!("listen = {}\n", quote(address)));
            notes.carried.push(format!("/server/ip-addr {address}"));
        }
        None => {}
    }
    for (key, name, quoted) in [
        ("/server/port", "port", false),
        ("/server/max-clients", "max_clients", false),
        ("/hostname", "hostname", true),
    ] {
        if let Some(value) = take(key) {
            out.push_str(&format!("{name} = {}\n", if quoted { quote(value) } else { value.to_owned() }));
            notes.carried.push(format!("{key} {value}"));
        }
    }
    for (key, name) in [("/server/max-latency", "max_latency"), ("/server/time-offset", "time_offset")] {
        if let Some(value) = take(key) {
            out.push_str(&format!("{name} = \"{value}s\"\n"));
            notes.carried.push(format!("{key} {value} s"));
        }
    }
    out.push_str("state_dir = \".\"\npid_file = \"ldmd.pid\"\n");

    out.push_str("\n[log]\nfile = \"var/logs/ldmd.log\"\n");
    if let Some(file) = take("/log/file") {
        notes.changed.push(format!("/log/file {file} → var/logs/ldmd.log (the new home's)"));
    }
    if let Some(count) = take("/log/count") {
        out.push_str(&format!("count = {count}\n"));
        notes.carried.push(format!("/log/count {count}"));
    }
    if let Some(rotate) = take("/log/rotate") {
        out.push_str(&format!("rotate = {}\n", truthy(rotate)));
        notes.carried.push(format!("/log/rotate {rotate}"));
    }

    out.push_str("\n[pqact]\nconfig = \"etc/pqact.conf\"\n");
    if let Some(path) = take("/pqact/config-path") {
        notes.changed.push(format!("/pqact/config-path {path} → etc/pqact.conf (a copy)"));
    }
    if let Some(datadir) = take("/pqact/datadir-path") {
        let datadir =
            if Path::new(datadir).is_absolute() { PathBuf::from(datadir) } else { plan.ldm_home.join(datadir) };
        out.push_str(&format!("datadir = {}\n", quote(&datadir.display().to_string())));
        notes.carried.push(format!("/pqact/datadir-path {} (decoded files go where they went)", datadir.display()));
    }

    out.push_str("\n[scour]\nconfig = \"etc/scour.conf\"\n");
    if let Some(path) = take("/scour/config-path") {
        notes.changed.push(format!("/scour/config-path {path} → etc/scour.conf (a copy)"));
    }

    out.push_str("\n[check]\n");
    let enabled = take("/check-time/enabled").is_none_or(truthy);
    let servers: Vec<String> = take("/check-time/ntpdate/servers")
        .map(|servers| servers.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    if enabled {
        let list: Vec<String> = servers.iter().map(|server| quote(server)).collect();
        out.push_str(&format!("time_servers = [{}]\n", list.join(", ")));
        notes.carried.push(format!("/check-time: servers {}", servers.join(" ")));
    } else {
        out.push_str("time_servers = []\n");
        notes.carried.push("/check-time/enabled 0: the clock is not checked".into());
    }
    if let Some(limit) = take("/check-time/limit") {
        out.push_str(&format!("time_limit = \"{limit}s\"\n"));
        notes.carried.push(format!("/check-time/limit {limit} s"));
    }
    for key in ["/check-time/warn-if-disabled", "/check-time/ntpdate/command", "/check-time/ntpdate/timeout"] {
        if take(key).is_some() {
            notes.changed.push(format!("{key}: ldm7 asks the servers by SNTP itself (5 s each)"));
        }
    }
    if let Some(interval) = take("/insertion-check-interval") {
        out.push_str(&format!("insertion_interval = \"{interval}s\"\n"));
        notes.carried.push(format!("/insertion-check-interval {interval} s"));
    }

    let anti_dos = take("/server/enable-anti-DOS");
    let retx = take("/fmtp-retx-timeout");
    if let Some(anti_dos) = anti_dos {
        out.push_str(&format!("\n[ldm6]\none_feeder_per_host = {}\n", truthy(anti_dos)));
        notes.carried.push(format!("/server/enable-anti-DOS {anti_dos} → [ldm6] one_feeder_per_host"));
    }
    if let Some(retx) = retx {
        out.push_str(&format!("\n[multicast]\nretx_timeout = \"{retx}s\"\n"));
        notes.carried.push(format!("/fmtp-retx-timeout {retx} s → [multicast] retx_timeout"));
    }

    for (key, value) in registry.iter() {
        if handled.contains(&key) {
            continue;
        }
        let why = if key.starts_with("/metrics") {
            "ldm7 serves Prometheus metrics ([server] metrics) and per-minute statistics instead"
        } else if key.starts_with("/pqsurf") || key.starts_with("/surf-queue") {
            "ldm7 has no pqsurf"
        } else if key.starts_with("/scour/") {
            "scour reads etc/scour_excludes.conf under the home when it exists"
        } else if key == "/oess-pathname" {
            "the OESS account is set in [path] (oess_url, oess_user, oess_password_file)"
        } else if key == "/reconciliation-mode" || key == "/delete-info-files" {
            "ldm7 keeps each REQUEST's resume point and deletes none"
        } else {
            "not used by ldm7"
        };
        notes.left_out.push(format!("{key} {value}: {why}"));
    }
    (out, notes)
}

/// ldmd.conf for the new home: every line kept, except EXEC entries of programs ldm7 has no
/// equivalent of (`pqsurf`, `pqbinstats`), which are commented out (each reported). `pqact`,
/// `rtstats` and `scour` are ldm7's own.
fn translate_ldmd_conf(text: &str) -> (String, Vec<String>) {
    let mut notes = Vec::new();
    let mut out = String::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let program = trimmed
            .get(..4)
            .filter(|keyword| keyword.eq_ignore_ascii_case("exec"))
            .and_then(|_| trimmed[4..].trim_start().trim_start_matches('"').split_whitespace().next())
            .map(|program| {
                Path::new(program.trim_end_matches('"')).file_name().map(|name| name.to_string_lossy().into_owned())
            });
        if let Some(Some(program)) = program
            && let Some(why) = unsupported_program(&program)
        {
            out.push_str(&format!("# ldm7 import: {why}\n# {line}\n"));
            notes.push(format!("ldmd.conf line {}: {}: {why} (commented out)", index + 1, line.trim()));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    (out, notes)
}

/// Why an EXEC'd LDM program cannot run under ldm7, if it cannot.
fn unsupported_program(program: &str) -> Option<&'static str> {
    match program {
        "pqsurf" => Some("ldm7 has no pqsurf"),
        "pqbinstats" => Some("ldm7 has no pqbinstats"),
        _ => None,
    }
}

/// The files an ldmd.conf INCLUDEs, recursively.
fn included_files(conf: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(text) = std::fs::read_to_string(conf) else { return files };
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.len() > 7 && trimmed[..7].eq_ignore_ascii_case("include") {
            let name = trimmed[7..].trim().trim_matches('"');
            let path = conf.parent().unwrap_or(Path::new(".")).join(name);
            files.push(path.clone());
            files.extend(included_files(&path));
        }
    }
    files
}

/// LDM's name of a request's resume file: `.<md5>.info` over the host as written, the port and
/// each (feedtype, pattern) as the reference hashes them (its native byte order: little-endian
/// 32-bit port and feedtype on the machines LDM runs on).
pub fn ldm_info_name(host: &str, port: u16, specs: &[(u32, &str)]) -> String {
    let mut hasher = Md5::new();
    hasher.update(host.as_bytes());
    hasher.update(u32::from(port).to_le_bytes());
    for (feedtype, pattern) in specs {
        if *feedtype != 0 {
            hasher.update(feedtype.to_le_bytes());
            hasher.update(pattern.as_bytes());
        }
    }
    format!(".{}.info", hex(&hasher.finalize()))
}

/// ldm7's name of the same resume file (`ldm7-server`'s `RequestSpec::state_path`).
pub fn ldm7_info_name(host: &str, port: u16, specs: &[(u32, &str)]) -> String {
    let mut hasher = Md5::new();
    hasher.update(host.as_bytes());
    hasher.update(port.to_be_bytes());
    for (feedtype, pattern) in specs {
        hasher.update(feedtype.to_be_bytes());
        hasher.update(pattern.as_bytes());
    }
    format!(".{}.info", hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The signature in an LDM resume file: `#` comment lines, then
/// `{arrival,feedtype,seqno,{len,origin},size,{len,ident},signature}` — its last 32 hex digits.
pub fn info_signature(text: &str) -> Option<String> {
    let info = text.lines().find(|line| !line.starts_with('#'))?.trim();
    let body = info.strip_suffix('}')?;
    let signature = body.get(body.len().checked_sub(32)?..)?;
    let separated = body.get(..body.len() - 32)?.ends_with(',');
    (separated && signature.chars().all(|c| c.is_ascii_hexdigit())).then(|| signature.to_ascii_lowercase())
}

/// Writes `bytes` to `path` unless it is there: identical (nothing to do) or different (kept,
/// reported).
fn write_new(path: &Path, bytes: &[u8], report: &mut ImportReport) -> Result<(), AdminError> {
    match std::fs::read(path) {
        Ok(existing) if existing == bytes => Ok(()),
        Ok(_) => {
            report.kept.push(path.to_owned());
            Ok(())
        }
        Err(_) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(AdminError::io(dir))?;
            }
            std::fs::write(path, bytes).map_err(AdminError::io(path))?;
            report.written.push(path.to_owned());
            Ok(())
        }
    }
}

fn copy_new(source: &Path, target: &Path, report: &mut ImportReport) -> Result<(), AdminError> {
    let bytes = std::fs::read(source).map_err(AdminError::io(source))?;
    write_new(target, &bytes, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_of_an_ldm_resume_file_is_read() {
        let text =
            "# comment\n{20250101120000.000000,EXP,7,{9,localhost},1234,{5,ident},0123456789abcdef0123456789ABCDEF}\n";
        assert_eq!(info_signature(text).as_deref(), Some("0123456789abcdef0123456789abcdef"));
        assert_eq!(info_signature("{broken"), None);
        assert_eq!(info_signature(""), None);
    }

    #[test]
    fn unsupported_execs_are_commented_out_and_the_rest_kept() {
        let (text, notes) = translate_ldmd_conf("EXEC\t\"pqact\"\nEXEC \"pqsurf -v\"\nALLOW ANY ^x$\n");
        assert_eq!(text.lines().next(), Some("EXEC\t\"pqact\""));
        assert!(text.contains("# EXEC \"pqsurf -v\""), "{text}");
        assert!(text.contains("ALLOW ANY ^x$"));
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn exec_files_are_pqacts_positional_arguments() {
        let argv: Vec<String> = ["pqact", "-f", "ANY", "-d", "/data", "etc/a.conf"].map(String::from).to_vec();
        assert_eq!(crate::pqact::pqact_arguments(&argv).unwrap(), ["etc/a.conf"]);
        assert_eq!(crate::pqact::pqact_arguments(&["scour".to_owned()]), None);
    }
}
