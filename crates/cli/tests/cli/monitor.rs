//! `ldm7 monitor` as an operator runs it: an LDM server holds statistics products (and an LDM 6
//! rtstats product, and a malformed one); the monitor requests them over LDM-6, stores them in
//! a SQLite file and answers its JSON API from it.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{LDM7, LOCAL, Node};
use ldm7_metrics::{Link, Minute, MinuteRow, MinuteSums, StatsProduct};
use ldm7_pq::Queue;
use ldm7_testkit::wait_until;
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};

fn get(port: u16, path: &str) -> (u16, String) {
    get_at(&format!("127.0.0.1:{port}"), path)
}

fn get_at(address: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split_whitespace().nth(1).and_then(|code| code.parse().ok()).expect("status");
    (status, body.to_owned())
}

fn json(port: u16, path: &str) -> serde_json::Value {
    let (status, body) = get(port, path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|error| panic!("{path}: {error}: {body}"))
}

/// A monitor process, killed if the test ends before it stopped it (a failed assertion left it
/// running).
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn insert(queue: &Queue, ident: &str, body: &[u8], arrival: Timestamp) {
    let info = ProdInfo {
        arrival,
        signature: Signature::md5_of(body),
        origin: "test".into(),
        feedtype: FeedType::EXP,
        seqno: 0,
        ident: ident.into(),
        size: body.len() as u32,
    };
    queue.insert(&info, body).expect("insert");
}

/// One minute of a link where every product came by FMTP, all but one by multicast alone:
/// `n` products of `size` bytes with `latency_us` each (`mc_latency_us` for the multicast-only).
fn fmtp_sums(
    n: u64,
    size: u64,
    latency_us: i64,
    mc_latency_us: i64,
    retx_blocks: u64,
    latency_max_us: i64,
) -> MinuteSums {
    MinuteSums {
        n,
        n_fmtp: n,
        n_mc: n - 1,
        s_all: n * size,
        s_fmtp: n * size,
        s_mc: (n - 1) * size,
        l_all_us: n as i64 * latency_us,
        l_fmtp_us: n as i64 * latency_us,
        l_mc_us: (n - 1) as i64 * mc_latency_us,
        retx_blocks,
        backstop: 0,
        backlog: 0,
        latency_max_us,
        host_drops: 0,
    }
}

/// A statistics product of `reporter` for one link and minute, inserted with `arrival`.
fn insert_stats(queue: &Queue, reporter: &str, link: &Link, minute: Minute, sums: MinuteSums, arrival: Timestamp) {
    let product =
        StatsProduct { reporter: reporter.into(), minute, rows: vec![MinuteRow { link: link.clone(), minute, sums }] };
    insert(queue, &product.ident(), product.body().as_bytes(), arrival);
}

#[test]
fn the_monitor_requests_statistics_stores_them_and_answers_its_api() {
    let root = tempfile::tempdir().expect("tempdir");
    let root = root.path();
    let mut node = Node::new(root, "node", "20M", &format!("ALLOW ANY {LOCAL}\n"));
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let link = Link { feed: "NGRID".into(), publisher: "pub.example:1".into(), subscriber: "sub.example:2".into() };
    {
        let queue = Queue::open(Path::new(&node.queue_path())).expect("queue");
        for (back, n) in [(3, 10u64), (2, 20)] {
            let minute = Minute(Minute::of(now).0 - back);
            // Datagrams dropped at the subscriber's host: half the products' count.
            let sums = MinuteSums { host_drops: n / 2, ..fmtp_sums(n, 1000, 10_000, 10_000, 1, 20_000) };
            insert_stats(&queue, "sub.example:2", &link, minute, sums, now);
        }
        insert(&queue, "ldm7-stats/1/sub.example:2/209901010000", b"not a statistics product", now);
        let rtstats = format!(
            "{} {} ldm6.example.edu NGRID ncep.example.gov 1234 98765432 1.5 0.87 3@3001 6.15.0\n",
            &now.to_string()[..14],
            &now.to_string()[..14]
        );
        insert(&queue, "rtstats-6.15.0/ldm6.example.edu/NGRID/ncep.example.gov", rtstats.as_bytes(), now);
        insert(&queue, "SAUS43 KWBC", b"not statistics", now);
    }
    node.start();

    let dir = root.join("monitor");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("nodes.toml"),
        "[[node]]\nname = \"sub.example:2\"\nlatitude = 40.0\nlongitude = -105.25\n",
    )
    .expect("nodes");
    let port = support::free_port();
    let log = std::fs::File::create(dir.join("log")).expect("log");
    let mut monitor = Command::new(LDM7)
        .args(["monitor", "--db"])
        .arg(format!("sqlite:{}", dir.join("monitor.db").display()))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--upstream", &format!("127.0.0.1:{}", node.port)])
        .arg("--state-dir")
        .arg(&dir)
        .arg("--nodes")
        .arg(dir.join("nodes.toml"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map(KilledOnDrop)
        .expect("start ldm7 monitor");
    wait_until(Duration::from_secs(30), "the monitor to store the link's two minutes", || {
        if !support::listening(port) {
            return None;
        }
        let links = json(port, "/api/links");
        let link = links.as_array()?.first()?.clone();
        (link["last_minute"].as_i64()? == Minute::of(now).0 - 2).then_some(())
    });
    // The rtstats product comes after the statistics products: stored a moment later.
    wait_until(Duration::from_secs(30), "the monitor to store the rtstats report", || {
        let nodes = json(port, "/api/nodes");
        nodes.as_array()?.iter().any(|node| node["name"] == "ldm6.example.edu").then_some(())
    });
    let nodes = json(port, "/api/nodes");
    let nodes = nodes.as_array().expect("an array");
    let find =
        |name: &str| nodes.iter().find(|node| node["name"] == name).unwrap_or_else(|| panic!("{name}: {nodes:?}"));
    let sub = find("sub.example:2");
    assert_eq!(
        (sub["color"].as_str(), sub["latitude"].as_f64(), sub["kind"].as_str()),
        (Some("green"), Some(40.0), Some("ldm7"))
    );
    assert_eq!(find("pub.example:1")["color"], "grey", "a publisher that never reported");
    assert_eq!(find("ldm6.example.edu")["kind"], "ldm6");
    let from = (Minute::of(now).0 - 5) * 60;
    let query = format!(
        "/api/series?feed=NGRID&publisher=pub.example:1&subscriber=sub.example:2&metric=products&from={from}&to={}",
        from + 300
    );
    let series = json(port, &query);
    let values: Vec<Option<f64>> =
        series["points"].as_array().expect("points").iter().map(|point| point[1].as_f64()).collect();
    assert_eq!(values[..5], [None, None, Some(10.0), Some(20.0), None], "{series}");
    // What the subscriber's host dropped, through the statistics product and the database.
    let drops = json(port, &query.replace("metric=products", "metric=host_drops"));
    let drops: Vec<Option<f64>> =
        drops["points"].as_array().expect("points").iter().map(|point| point[1].as_f64()).collect();
    assert_eq!(drops[2..4], [Some(5.0), Some(10.0)], "{drops:?}");
    // Two-minute steps: each the sum of its minutes.
    let series = json(port, &format!("{query}&step=2").replace("metric=products", "metric=ffdr_count"));
    assert_eq!(series["points"][1][1].as_f64(), Some(1.0), "{series}");
    // The LDM 6 host's rtstats: a link from the products' origin to it, with hourly points.
    let links = json(port, "/api/links");
    let ldm6 =
        links.as_array().expect("links").iter().find(|link| link["kind"] == "ldm6").expect("an ldm6 link").clone();
    assert_eq!(
        (ldm6["publisher"].as_str(), ldm6["subscriber"].as_str()),
        (Some("ncep.example.gov"), Some("ldm6.example.edu"))
    );
    let series = json(
        port,
        &format!(
            "/api/series?feed=NGRID&publisher=ncep.example.gov&subscriber=ldm6.example.edu&metric=products&from={}&to={}",
            now.secs - 3600,
            now.secs + 60
        ),
    );
    assert_eq!(
        (series["step_minutes"].as_i64(), series["points"][0][1].as_f64()),
        (Some(60), Some(1234.0)),
        "{series}"
    );
    let (status, body) = get(port, &query.replace("metric=products", "metric=bogus"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("throughput_fmtp"), "{body}");

    let _ = Command::new("kill").args(["-TERM", &monitor.0.id().to_string()]).status();
    let status = wait_until(Duration::from_secs(15), "the monitor to exit", || monitor.0.try_wait().expect("wait"));
    assert!(status.success());
    let log = std::fs::read_to_string(dir.join("log")).expect("log");
    assert!(log.contains("2 statistics products stored (1 refused, 0 seen before), 1 rtstats (0 refused)"), "{log}");
    node.stop();
}

/// The dashboard in the distribution's headless Chromium (playwright-core from the dashboard's
/// npm packages): the nodes with the colors of their last reports, a click on a link draws its
/// chart with points; the screenshot is saved as target/monitor-dashboard.png.
#[test]
fn the_dashboard_in_a_real_browser() {
    let names = Names { publisher: "pub.example", subscriber: "sub.example", quiet_one: "quiet.example" };
    dashboard_in_a_real_browser(names, "127.0.0.1", "monitor-dashboard.png");
}

/// The same with IPv6 nodes (a publisher named by its address, as a RECEIVE of `[v6]:388`
/// names it, and a subscriber's statistics name with its port), the monitor and its upstream on
/// IPv6 loopback and the browser at `http://[::1]:PORT/`.
#[test]
fn the_dashboard_shows_ipv6_nodes() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        ldm7_testkit::skip("no IPv6 loopback (::1) on this host");
        return;
    }
    let names = Names { publisher: "2001:db8::1", subscriber: "[2001:db8::2]:38800", quiet_one: "2001:db8::3" };
    dashboard_in_a_real_browser(names, "[::1]", "monitor-dashboard-ipv6.png");
}

/// The three nodes of the dashboard test.
struct Names {
    publisher: &'static str,
    subscriber: &'static str,
    quiet_one: &'static str,
}

fn dashboard_in_a_real_browser(names: Names, loopback: &str, screenshot_name: &str) {
    let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("../monitor/web");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).is_file() {
        ldm7_testkit::skip("no Chromium at /usr/bin/chromium (the distribution's chromium package; or set CHROMIUM)");
        return;
    }
    if !web.join("node_modules/playwright-core").is_dir() {
        ldm7_testkit::skip("the dashboard's npm packages are not installed (npm ci in crates/monitor/web)");
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let root = root.path();
    let mut node = Node::new(root, "node", "20M", &format!("ALLOW ANY {LOCAL}\nALLOW ANY ::1\n"));
    let Names { publisher, subscriber, quiet_one } = names;
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    {
        let queue = Queue::open(Path::new(&node.queue_path())).expect("queue");
        let link = Link { feed: "NGRID".into(), publisher: publisher.into(), subscriber: subscriber.into() };
        for back in 2..12 {
            let minute = Minute(Minute::of(now).0 - back);
            let n = 10 + back as u64;
            insert_stats(&queue, subscriber, &link, minute, fmtp_sums(n, 1_000_000, 400_000, 300_000, 3, 900_000), now);
        }
        // A node whose last report is 20 minutes old (yellow).
        let old = Timestamp { secs: now.secs - 1200, micros: 0 };
        let minute = Minute::of(old);
        let quiet = Link { feed: "NGRID".into(), publisher: publisher.into(), subscriber: quiet_one.into() };
        let sums = MinuteSums {
            n: 1,
            n_fmtp: 1,
            n_mc: 1,
            s_all: 10,
            s_fmtp: 10,
            s_mc: 10,
            l_all_us: 5,
            l_fmtp_us: 5,
            l_mc_us: 5,
            ..MinuteSums::default()
        };
        insert_stats(&queue, quiet_one, &quiet, minute, sums, old);
    }
    node.start();
    let dir = root.join("monitor");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("nodes.toml"),
        format!(
            "[[node]]\nname = \"{publisher}\"\nlatitude = 40.015\nlongitude = -105.27\n\n\
             [[node]]\nname = \"{subscriber}\"\nlatitude = 35.18\nlongitude = -97.44\n\n\
             [[node]]\nname = \"{quiet_one}\"\nlatitude = 41.66\nlongitude = -91.53\n"
        ),
    )
    .expect("nodes");
    let port = support::free_port();
    let mut monitor = Command::new(LDM7)
        .args(["monitor", "--db"])
        .arg(format!("sqlite:{}", dir.join("monitor.db").display()))
        .args(["--listen", &format!("{loopback}:{port}"), "--upstream", &format!("{loopback}:{}", node.port)])
        .arg("--state-dir")
        .arg(&dir)
        .arg("--nodes")
        .arg(dir.join("nodes.toml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(KilledOnDrop)
        .expect("start ldm7 monitor");
    wait_until(Duration::from_secs(30), "the monitor to store both links", || {
        if !support::listening(port) {
            return None;
        }
        let (status, links) = get_at(&format!("{loopback}:{port}"), "/api/links");
        let links: serde_json::Value = serde_json::from_str(&links).ok().filter(|_| status == 200)?;
        (links.as_array()?.len() == 2).then_some(())
    });
    let screenshot = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../target/{screenshot_name}"));
    let output = Command::new("node")
        .arg(web.join("test/browser.mjs"))
        .arg(format!("http://{loopback}:{port}/"))
        .arg(&screenshot)
        .arg(format!("NGRID|{publisher}|{subscriber}"))
        .env("CHROMIUM", &chromium)
        .output()
        .expect("run node");
    let _ = Command::new("kill").args(["-TERM", &monitor.0.id().to_string()]).status();
    let _ = monitor.0.wait();
    node.stop();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "browser: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).expect("the browser's report");
    assert_eq!(result["nodes"][subscriber], "green", "{result}");
    assert_eq!(result["nodes"][quiet_one], "yellow", "{result}");
    assert_eq!(result["nodes"][publisher], "grey", "{result}");
    assert!(result["points"].as_u64().is_some_and(|points| points >= 3), "{result}");
    let title = format!("{publisher} → {subscriber}");
    assert!(result["title"].as_str().is_some_and(|shown| shown.starts_with(&title)), "{result}");
    assert_eq!(result["errors"].as_array().map(Vec::len), Some(0), "{result}");
    assert!(screenshot.is_file());
}
