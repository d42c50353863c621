//! The monitor's JSON API (axum):
//!
//! | request | answer |
//! |---|---|
//! | `GET /api/nodes` | every node: name, location, last report, its age and its color (`green` under 10 minutes, `yellow` under an hour, `red` older, `grey` never) |
//! | `GET /api/links[?feed=F]` | every link (feed, publisher, subscriber) with its newest minute and its kind: `ldm7` (statistics products) or `ldm6` (rtstats: the upstream a relayed origin `origin_v_upstream` names, else the origin → reporting host; the origins that came by one upstream summed) |
//! | `GET /api/series?feed=&publisher=&subscriber=&metric=[&from=&to=&step=]` | a link's metric per step of minutes (`from`/`to`: Unix seconds, default the last hour; `step`: minutes, default 1), each step derived from its minutes' summed sums |
//!
//! Metrics: `throughput_fmtp`, `throughput_mc`, `throughput_retx` (bit/s), `ffdr_count`,
//! `ffdr_size`, `mplr`, `latency_mean`, `latency_max` (seconds), `products` (N), `bytes` (ΣS),
//! `backstop`, `backlog`, `host_drops` (multicast datagrams dropped at the subscriber's host: its
//! socket buffer was full; not path loss). A step with no product, or a metric undefined in it, is `null`. An
//! `ldm6` link has hourly points (`step_minutes` 60) of `products`, `bytes`, `latency_mean` and
//! `latency_max`, as its host's rtstats reported them.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use ldm7_metrics::{Link, Minute, MinuteSums};
use serde::{Deserialize, Serialize};

use crate::store::Store;

/// Reports younger than this are green.
pub const GREEN_SECS: i64 = 600;
/// Reports younger than this (and not green) are yellow; older ones red.
pub const YELLOW_SECS: i64 = 3600;

/// The metrics a series can show.
pub const METRICS: [&str; 13] = [
    "throughput_fmtp",
    "throughput_mc",
    "throughput_retx",
    "ffdr_count",
    "ffdr_size",
    "mplr",
    "latency_mean",
    "latency_max",
    "products",
    "bytes",
    "backstop",
    "backlog",
    "host_drops",
];

/// A node with its color.
#[derive(Debug, Serialize)]
pub struct NodeStatus {
    /// Its name.
    pub name: String,
    /// Latitude, if configured.
    pub latitude: Option<f64>,
    /// Longitude, if configured.
    pub longitude: Option<f64>,
    /// Its last report, Unix seconds.
    pub last_report: Option<i64>,
    /// Seconds since then.
    pub age_s: Option<i64>,
    /// `green`, `yellow`, `red` or `grey`.
    pub color: &'static str,
    /// `ldm7` or `ldm6`.
    pub kind: Option<String>,
}

/// The color of a node whose last report is `age_s` old.
pub fn color(age_s: Option<i64>) -> &'static str {
    match age_s {
        None => "grey",
        Some(age) if age < GREEN_SECS => "green",
        Some(age) if age < YELLOW_SECS => "yellow",
        Some(_) => "red",
    }
}

/// One metric's value of a set of sums.
pub fn metric_value(metric: &str, sums: &MinuteSums) -> Option<f64> {
    if metric == "host_drops" {
        // Counted whether or not a product arrived in the step.
        return Some(sums.host_drops as f64);
    }
    if sums.n == 0 {
        return None;
    }
    let derived = sums.derived();
    match metric {
        "throughput_fmtp" => derived.throughput_fmtp_bps,
        "throughput_mc" => derived.throughput_mc_bps,
        "throughput_retx" => derived.throughput_retx_bps,
        "ffdr_count" => derived.ffdr_count,
        "ffdr_size" => derived.ffdr_size,
        "mplr" => derived.mplr,
        "latency_mean" => derived.latency_mean_us.map(|us| us / 1e6),
        "latency_max" => Some(sums.latency_max_us as f64 / 1e6),
        "products" => Some(sums.n as f64),
        "bytes" => Some(sums.s_all as f64),
        "backstop" => Some(sums.backstop as f64),
        "backlog" => Some(sums.backlog as f64),
        _ => None,
    }
}

#[derive(Debug, Deserialize)]
struct LinksQuery {
    feed: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SeriesQuery {
    feed: String,
    publisher: String,
    subscriber: String,
    metric: String,
    from: Option<i64>,
    to: Option<i64>,
    step: Option<i64>,
}

/// A series: `[step start (Unix seconds), value or null]` pairs.
#[derive(Debug, Serialize)]
struct Series {
    metric: String,
    step_minutes: i64,
    points: Vec<(i64, Option<f64>)>,
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs() as i64)
}

async fn nodes(State(store): State<Store>) -> Response {
    match store.nodes().await {
        Ok(nodes) => {
            let now = now_secs();
            let nodes: Vec<NodeStatus> = nodes
                .into_iter()
                .map(|node| {
                    let age_s = node.last_report.map(|at| (now - at).max(0));
                    NodeStatus {
                        name: node.name,
                        latitude: node.latitude,
                        longitude: node.longitude,
                        last_report: node.last_report,
                        age_s,
                        color: color(age_s),
                        kind: node.kind,
                    }
                })
                .collect();
            Json(nodes).into_response()
        }
        Err(failure) => error(StatusCode::INTERNAL_SERVER_ERROR, failure.to_string()),
    }
}

async fn links(State(store): State<Store>, Query(query): Query<LinksQuery>) -> Response {
    match store.links(query.feed.as_deref().filter(|feed| !feed.is_empty())).await {
        Ok(links) => Json(links).into_response(),
        Err(failure) => error(StatusCode::INTERNAL_SERVER_ERROR, failure.to_string()),
    }
}

async fn series(State(store): State<Store>, Query(query): Query<SeriesQuery>) -> Response {
    if !METRICS.contains(&query.metric.as_str()) {
        return error(StatusCode::BAD_REQUEST, format!("metric {:?}: one of {}", query.metric, METRICS.join(", ")));
    }
    let to = query.to.unwrap_or_else(now_secs);
    let from = query.from.unwrap_or(to - 3600);
    let step = query.step.unwrap_or(1);
    if !(1..=10_080).contains(&step) || from >= to || to - from > 366 * 86_400 {
        return error(
            StatusCode::BAD_REQUEST,
            "need from < to (at most a year apart) and 1 ≤ step ≤ 10080 minutes".into(),
        );
    }
    let link = Link { feed: query.feed, publisher: query.publisher, subscriber: query.subscriber };
    let (first, last) = (Minute(from.div_euclid(60)), Minute(to.div_euclid(60) + 1));
    let minutes = match store.minutes(&link, first, last).await {
        Ok(minutes) => minutes,
        Err(failure) => return error(StatusCode::INTERNAL_SERVER_ERROR, failure.to_string()),
    };
    if minutes.is_empty() && ["products", "bytes", "latency_mean", "latency_max"].contains(&query.metric.as_str()) {
        // An LDM 6 link: its hourly rtstats bins.
        let hours = match store.rtstats_hours(&link, from.div_euclid(3600), to.div_euclid(3600) + 1).await {
            Ok(hours) => hours,
            Err(failure) => return error(StatusCode::INTERNAL_SERVER_ERROR, failure.to_string()),
        };
        if !hours.is_empty() {
            let points = hours
                .iter()
                .map(|bin| {
                    let value = match query.metric.as_str() {
                        "products" => bin.products as f64,
                        "bytes" => bin.bytes as f64,
                        "latency_mean" => bin.latency_mean_s,
                        _ => bin.latency_max_s,
                    };
                    (bin.hour * 3600, Some(value))
                })
                .collect();
            return Json(Series { metric: query.metric, step_minutes: 60, points }).into_response();
        }
    }
    let steps = ((last.0 - first.0) + step - 1) / step;
    let mut sums = vec![MinuteSums::default(); steps as usize];
    for (minute, minute_sums) in &minutes {
        sums[((minute.0 - first.0) / step) as usize].merge(minute_sums);
    }
    let points = sums
        .iter()
        .enumerate()
        .map(|(index, sums)| ((first.0 + index as i64 * step) * 60, metric_value(&query.metric, sums)))
        .collect();
    Json(Series { metric: query.metric, step_minutes: step, points }).into_response()
}

/// The dashboard, served from the binary: its page and style as written (`web/src/`), its
/// script as bundled from `web/src/app.js` (`npm ci && npm run build`; the bundle is kept in the
/// repository so that building `ldm7` needs no npm).
const INDEX_HTML: &str = include_str!("../web/src/index.html");
const APP_JS: &str = include_str!("../web/dist/app.js");
const STYLE_CSS: &str = include_str!("../web/src/style.css");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response()
}

/// The API's routes over `store`, and the dashboard.
pub fn router(store: Store) -> Router {
    Router::new()
        .route("/", axum::routing::get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/app.js", axum::routing::get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/style.css", axum::routing::get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }))
        .route("/api/nodes", axum::routing::get(nodes))
        .route("/api/links", axum::routing::get(links))
        .route("/api/series", axum::routing::get(series))
        .with_state(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colors_follow_the_age_of_the_last_report() {
        assert_eq!(color(None), "grey");
        assert_eq!(color(Some(0)), "green");
        assert_eq!(color(Some(599)), "green");
        assert_eq!(color(Some(600)), "yellow");
        assert_eq!(color(Some(3599)), "yellow");
        assert_eq!(color(Some(3600)), "red");
    }

    #[test]
    fn metric_values() {
        let sums = MinuteSums {
            n: 2,
            n_fmtp: 2,
            n_mc: 1,
            s_all: 3000,
            s_fmtp: 3000,
            s_mc: 1000,
            l_all_us: 2_000_000,
            l_fmtp_us: 2_000_000,
            l_mc_us: 1_000_000,
            retx_blocks: 1,
            backstop: 0,
            backlog: 0,
            latency_max_us: 1_500_000,
            host_drops: 0,
        };
        assert_eq!(metric_value("throughput_fmtp", &sums), Some(12_000.0));
        assert_eq!(metric_value("latency_max", &sums), Some(1.5));
        assert_eq!(metric_value("latency_mean", &sums), Some(1.0));
        assert_eq!(metric_value("products", &MinuteSums::default()), None);
        assert_eq!(metric_value("host_drops", &MinuteSums { host_drops: 7, ..MinuteSums::default() }), Some(7.0));
    }
}
