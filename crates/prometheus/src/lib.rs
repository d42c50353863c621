//! Prometheus metrics over HTTP: the text exposition format (version 0.0.4; [`Exposition`]) and
//! an endpoint serving `GET /metrics` from a thread of its own ([`Endpoint`]). What the metrics
//! are is the caller's: the server renders its counters (`ldm7_server`'s `prometheus` module,
//! which lists them).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

/// A metric family read per feed: name, type, help, and the value of a feed's item.
pub type Family<T> = (&'static str, &'static str, &'static str, fn(&T) -> u64);

/// Text in the exposition format.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// The text so far.
    pub fn into_text(self) -> String {
        self.text
    }

    /// Starts a family: its HELP and TYPE lines.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample of the current family, with its labels (values escaped).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (index, (key, value)) in labels.iter().enumerate() {
                if index > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{key}=\"{}\"", escape(value));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// Metric families with one sample per feed: each family's value read from each feed's
    /// item.
    pub fn per_feed<'a, T: 'a>(
        &mut self,
        families: &[Family<T>],
        feeds: impl Iterator<Item = (&'a str, &'a T)> + Clone,
    ) {
        for (name, kind, help, value) in families {
            self.family(name, kind, help);
            for (feed, item) in feeds.clone() {
                self.sample(name, &[("feed", feed)], value(item));
            }
        }
    }
}

/// A label value as the format wants it: `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What the endpoint serves: the metrics, rendered at each request.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The metrics endpoint: a thread serving `GET /metrics` until `stop` is set.
#[derive(Debug)]
pub struct Endpoint {
    /// Where it listens.
    pub address: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    thread: JoinHandle<()>,
}

impl Endpoint {
    /// Binds `listen` and starts serving.
    pub fn start(render: Render, listen: SocketAddr) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name("metrics".into()).spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                let app = axum::Router::new().route(
                    "/metrics",
                    axum::routing::get(move || {
                        let render = render.clone();
                        async move {
                            ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], render())
                        }
                    }),
                );
                let shutdown = async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                if let Err(error) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
                    tracing::error!("metrics endpoint: {error}");
                }
            });
        })?;
        tracing::info!("Prometheus metrics on http://{address}/metrics");
        Ok(Self { address, stop, thread })
    }

    /// Stops serving.
    pub fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_format() {
        let mut out = Exposition::default();
        out.family("ldm7_x_total", "counter", "What x counts.");
        out.sample("ldm7_x_total", &[("receive", "host \"a\"\\b\nc"), ("mode", "multicast")], 7);
        out.single("ldm7_y", "gauge", "Y.", 1.5);
        assert_eq!(
            out.text,
            "# HELP ldm7_x_total What x counts.\n# TYPE ldm7_x_total counter\n\
             ldm7_x_total{receive=\"host \\\"a\\\"\\\\b\\nc\",mode=\"multicast\"} 7\n\
             # HELP ldm7_y Y.\n# TYPE ldm7_y gauge\nldm7_y 1.5\n"
        );
    }
}
