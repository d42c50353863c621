//! The monitor's database: SQLite (the embedded default, `sqlite:PATH`) or PostgreSQL
//! (`postgres://…`), through the same queries (sqlx's `Any` driver) and the same migrations
//! (`crates/monitor/migrations`, applied at open).
//!
//! Rows are per link and minute and hold sums: a row reported again (a late delivery published
//! in a later product) is added to what is there, so longer windows are always sums of minutes.

use std::future::Future;
use std::pin::Pin;

use ldm7_metrics::rtstats::upstream_of as rtstats_upstream;
use ldm7_metrics::{Link, Minute, MinuteRow, MinuteSums, RtStats};
use sqlx::AnyPool;
use sqlx::Row;
use sqlx::any::AnyPoolOptions;
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use std::collections::BTreeMap;

/// The migrations, embedded in the binary: version, description and SQL, in the order of
/// their files in `crates/monitor/migrations` (`VERSION_DESCRIPTION.sql`). Their checksums
/// (SHA-384 of the SQL) are what a database already migrated holds, so a file must not change
/// once released: a change is a new file.
const MIGRATIONS: Embedded = Embedded(&[
    (20261123000001, "initial", include_str!("../migrations/20261123000001_initial.sql")),
    (20261123000002, "ingested", include_str!("../migrations/20261123000002_ingested.sql")),
    (20261127000003, "host_drops", include_str!("../migrations/20261127000003_host_drops.sql")),
]);

/// Migrations compiled in (sqlx's `migrate!` macro does the same at the cost of a second
/// build of sqlx and its drivers for the macro).
#[derive(Debug)]
struct Embedded(&'static [(i64, &'static str, &'static str)]);

impl MigrationSource<'static> for Embedded {
    fn resolve(self) -> Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send>> {
        let migrations = self
            .0
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(version, description.into(), MigrationType::Simple, sql.into(), false)
            })
            .collect();
        Box::pin(std::future::ready(Ok(migrations)))
    }
}

/// The database failed or cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL is neither `sqlite:PATH` nor `postgres://…`.
    #[error("database {0:?}: give sqlite:PATH or postgres://USER@HOST/DB")]
    Url(String),
    /// The database failed.
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    /// The migrations failed.
    #[error("database migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// A node as the dashboard shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NodeRow {
    /// Its name (host, or host:port).
    pub name: String,
    /// Configured location, if any.
    pub latitude: Option<f64>,
    /// Configured location, if any.
    pub longitude: Option<f64>,
    /// Its last report (Unix seconds), if it ever reported.
    pub last_report: Option<i64>,
    /// `ldm7` (statistics products) or `ldm6` (rtstats), if it reported.
    pub kind: Option<String>,
}

/// A link and its newest minute.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LinkRow {
    /// The feed.
    pub feed: String,
    /// The publisher.
    pub publisher: String,
    /// The subscriber.
    pub subscriber: String,
    /// Its newest minute (minutes since 1970; for an rtstats link, the start of its newest hour).
    pub last_minute: i64,
    /// `ldm7` (statistics products, per minute) or `ldm6` (rtstats, per hour).
    pub kind: String,
}

/// One hourly bin of an LDM 6 link (from rtstats).
#[derive(Clone, Debug, PartialEq)]
pub struct RtStatsHour {
    /// Hours since 1970.
    pub hour: i64,
    /// Products in the hour (as last reported).
    pub products: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Mean latency, s.
    pub latency_mean_s: f64,
    /// Largest latency, s.
    pub latency_max_s: f64,
}

/// The database.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
}

/// The sums as the columns hold them (64-bit integers; a larger count is stored as the largest).
fn sums_values(sums: &MinuteSums) -> [i64; 14] {
    sums.values().map(|value| i64::try_from(value).unwrap_or(i64::MAX))
}

fn sums_from(row: &sqlx::any::AnyRow) -> Result<MinuteSums, sqlx::Error> {
    let mut values = [0i128; 14];
    for (value, column) in values.iter_mut().zip(MinuteSums::NAMES) {
        *value = row.try_get::<i64, _>(column)?.into();
    }
    MinuteSums::from_values(values)
        .map_err(|index| sqlx::Error::Decode(format!("{} is negative", MinuteSums::NAMES[index]).into()))
}

impl Store {
    /// Opens (creating if needed) and migrates the database at `url`: `sqlite:PATH` or
    /// `postgres://…`.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let url = if let Some(path) = url.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(StoreError::Url(url.to_owned()));
            }
            if path.contains('?') { url.to_owned() } else { format!("sqlite:{path}?mode=rwc") }
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            url.to_owned()
        } else {
            return Err(StoreError::Url(url.to_owned()));
        };
        let pool = AnyPoolOptions::new().max_connections(4).connect(&url).await?;
        Migrator::new(MIGRATIONS).await?.run(&pool).await?;
        Ok(Self { pool })
    }

    /// Adds rows of per-minute sums (to what each link and minute holds already).
    pub async fn add_rows(&self, rows: &[MinuteRow]) -> Result<(), StoreError> {
        let mut transaction = self.pool.begin().await?;
        Self::add_rows_in(&mut transaction, rows).await?;
        transaction.commit().await?;
        Ok(())
    }

    async fn add_rows_in(connection: &mut sqlx::AnyConnection, rows: &[MinuteRow]) -> Result<(), StoreError> {
        let columns = MinuteSums::NAMES.join(", ");
        let placeholders: Vec<String> = (1..=4 + MinuteSums::NAMES.len()).map(|index| format!("${index}")).collect();
        let updates: Vec<String> = MinuteSums::NAMES
            .iter()
            .map(|column| {
                if *column == "latency_max_us" {
                    "latency_max_us = CASE WHEN excluded.latency_max_us > link_minutes.latency_max_us \
                     THEN excluded.latency_max_us ELSE link_minutes.latency_max_us END"
                        .to_owned()
                } else {
                    format!("{column} = link_minutes.{column} + excluded.{column}")
                }
            })
            .collect();
        let sql = format!(
            "INSERT INTO link_minutes (feed, publisher, subscriber, minute, {columns}) VALUES ({}) \
             ON CONFLICT (feed, publisher, subscriber, minute) DO UPDATE SET {}",
            placeholders.join(", "),
            updates.join(", ")
        );
        for row in rows {
            let mut query = sqlx::query(&sql)
                .bind(row.link.feed.clone())
                .bind(row.link.publisher.clone())
                .bind(row.link.subscriber.clone())
                .bind(row.minute.0);
            for value in sums_values(&row.sums) {
                query = query.bind(value);
            }
            query.execute(&mut *connection).await?;
        }
        Ok(())
    }

    /// Stores a statistics product once: `false` (and nothing changed) when a product with this
    /// signature was stored before. Its rows, its reporter's report and the signature are
    /// written in one transaction.
    pub async fn add_stats_product(
        &self,
        signature: &str,
        product: &ldm7_metrics::StatsProduct,
        reported: i64,
    ) -> Result<bool, StoreError> {
        let mut transaction = self.pool.begin().await?;
        let claimed =
            sqlx::query("INSERT INTO ingested (signature, at) VALUES ($1, $2) ON CONFLICT (signature) DO NOTHING")
                .bind(signature.to_owned())
                .bind(reported)
                .execute(&mut *transaction)
                .await?
                .rows_affected();
        if claimed == 0 {
            return Ok(false);
        }
        Self::add_rows_in(&mut transaction, &product.rows).await?;
        Self::note_report_in(&mut transaction, &product.reporter, reported, "ldm7").await?;
        transaction.commit().await?;
        Ok(true)
    }

    /// Notes a report from `node` at `at` (Unix seconds); the newest report is kept.
    pub async fn note_report(&self, node: &str, at: i64, kind: &str) -> Result<(), StoreError> {
        let mut connection = self.pool.acquire().await?;
        Self::note_report_in(&mut connection, node, at, kind).await
    }

    async fn note_report_in(
        connection: &mut sqlx::AnyConnection,
        node: &str,
        at: i64,
        kind: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO reports (node, last_report, kind) VALUES ($1, $2, $3) \
             ON CONFLICT (node) DO UPDATE SET \
             kind = CASE WHEN excluded.last_report >= reports.last_report THEN excluded.kind ELSE reports.kind END, \
             last_report = CASE WHEN excluded.last_report > reports.last_report THEN excluded.last_report ELSE reports.last_report END",
        )
        .bind(node.to_owned())
        .bind(at)
        .bind(kind.to_owned())
        .execute(&mut *connection)
        .await?;
        Ok(())
    }

    /// Keeps an rtstats report (the latest of its hourly bin).
    pub async fn add_rtstats(&self, stats: &RtStats, reported: i64) -> Result<(), StoreError> {
        let hour = stats.creation.secs.div_euclid(3600);
        sqlx::query(
            "INSERT INTO rtstats (host, feed, origin, hour, products, bytes, latency_mean_s, latency_max_s, reported) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (host, feed, origin, hour) DO UPDATE SET products = excluded.products, bytes = excluded.bytes, \
             latency_mean_s = excluded.latency_mean_s, latency_max_s = excluded.latency_max_s, reported = excluded.reported",
        )
        .bind(stats.host.clone())
        .bind(stats.feed.clone())
        .bind(stats.origin.clone())
        .bind(hour)
        .bind(i64::try_from(stats.products).unwrap_or(i64::MAX))
        .bind(i64::try_from(stats.bytes).unwrap_or(i64::MAX))
        .bind(stats.latency_mean_s)
        .bind(stats.latency_max_s)
        .bind(reported)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Sets a node's location.
    pub async fn set_location(&self, name: &str, latitude: f64, longitude: f64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO nodes (name, latitude, longitude) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET latitude = excluded.latitude, longitude = excluded.longitude",
        )
        .bind(name.to_owned())
        .bind(latitude)
        .bind(longitude)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every node: configured, reporting, or named by a link; sorted by name.
    pub async fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        let mut nodes: std::collections::BTreeMap<String, NodeRow> = Default::default();
        let blank = |name: &str| NodeRow {
            name: name.to_owned(),
            latitude: None,
            longitude: None,
            last_report: None,
            kind: None,
        };
        for row in sqlx::query("SELECT DISTINCT publisher, subscriber FROM link_minutes").fetch_all(&self.pool).await? {
            for column in ["publisher", "subscriber"] {
                let name: String = row.try_get(column)?;
                nodes.entry(name.clone()).or_insert_with(|| blank(&name));
            }
        }
        for row in sqlx::query("SELECT DISTINCT host, origin FROM rtstats").fetch_all(&self.pool).await? {
            let host: String = row.try_get("host")?;
            let origin: String = row.try_get("origin")?;
            for name in [host.as_str(), rtstats_upstream(&origin)] {
                nodes.entry(name.to_owned()).or_insert_with(|| blank(name));
            }
        }
        for row in sqlx::query("SELECT name, latitude, longitude FROM nodes").fetch_all(&self.pool).await? {
            let name: String = row.try_get("name")?;
            let node = nodes.entry(name.clone()).or_insert_with(|| blank(&name));
            node.latitude = Some(row.try_get("latitude")?);
            node.longitude = Some(row.try_get("longitude")?);
        }
        for row in sqlx::query("SELECT node, last_report, kind FROM reports").fetch_all(&self.pool).await? {
            let name: String = row.try_get("node")?;
            let node = nodes.entry(name.clone()).or_insert_with(|| blank(&name));
            node.last_report = Some(row.try_get("last_report")?);
            node.kind = Some(row.try_get("kind")?);
        }
        Ok(nodes.into_values().collect())
    }

    /// Every link (of `feed`, if given) with its newest minute.
    pub async fn links(&self, feed: Option<&str>) -> Result<Vec<LinkRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT feed, publisher, subscriber, MAX(minute) AS last_minute FROM link_minutes \
             WHERE ($1 = '' OR feed = $2) GROUP BY feed, publisher, subscriber ORDER BY feed, publisher, subscriber",
        )
        .bind(feed.unwrap_or_default().to_owned())
        .bind(feed.unwrap_or_default().to_owned())
        .fetch_all(&self.pool)
        .await?;
        let mut links = rows
            .iter()
            .map(|row| {
                Ok(LinkRow {
                    feed: row.try_get("feed")?,
                    publisher: row.try_get("publisher")?,
                    subscriber: row.try_get("subscriber")?,
                    last_minute: row.try_get("last_minute")?,
                    kind: "ldm7".into(),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        // LDM 6 hosts: a link from the host each product came from to the host that reported
        // it — the upstream an origin `origin_v_upstream` names, else the origin itself.
        let rows = sqlx::query(
            "SELECT feed, origin, host, MAX(hour) AS last_hour FROM rtstats \
             WHERE ($1 = '' OR feed = $2) GROUP BY feed, origin, host",
        )
        .bind(feed.unwrap_or_default().to_owned())
        .bind(feed.unwrap_or_default().to_owned())
        .fetch_all(&self.pool)
        .await?;
        let mut ldm6: BTreeMap<(String, String, String), i64> = BTreeMap::new();
        for row in &rows {
            let origin: String = row.try_get("origin")?;
            let key = (row.try_get("feed")?, rtstats_upstream(&origin).to_owned(), row.try_get("host")?);
            let last_hour: i64 = row.try_get("last_hour")?;
            let newest = ldm6.entry(key).or_insert(last_hour);
            *newest = (*newest).max(last_hour);
        }
        links.extend(ldm6.into_iter().map(|((feed, publisher, subscriber), last_hour)| LinkRow {
            feed,
            publisher,
            subscriber,
            last_minute: last_hour * 60,
            kind: "ldm6".into(),
        }));
        Ok(links)
    }

    /// An LDM 6 link's hourly bins in `[from_hour, to_hour)` (publisher = the upstream the
    /// products' origins name, [`rtstats_upstream`]; subscriber = the reporting host), oldest
    /// first: the origins that came by one upstream summed (latency: the mean weighted by
    /// products, the largest).
    pub async fn rtstats_hours(
        &self,
        link: &Link,
        from_hour: i64,
        to_hour: i64,
    ) -> Result<Vec<RtStatsHour>, StoreError> {
        let rows = sqlx::query(
            "SELECT origin, hour, products, bytes, latency_mean_s, latency_max_s FROM rtstats \
             WHERE feed = $1 AND host = $2 AND hour >= $3 AND hour < $4 ORDER BY hour",
        )
        .bind(link.feed.clone())
        .bind(link.subscriber.clone())
        .bind(from_hour)
        .bind(to_hour)
        .fetch_all(&self.pool)
        .await?;
        let mut hours: BTreeMap<i64, RtStatsHour> = BTreeMap::new();
        for row in &rows {
            let origin: String = row.try_get("origin")?;
            if rtstats_upstream(&origin) != link.publisher {
                continue;
            }
            let hour: i64 = row.try_get("hour")?;
            let products = row.try_get::<i64, _>("products")?.max(0) as u64;
            let bytes = row.try_get::<i64, _>("bytes")?.max(0) as u64;
            let mean: f64 = row.try_get("latency_mean_s")?;
            let max: f64 = row.try_get("latency_max_s")?;
            let bin = hours.entry(hour).or_insert(RtStatsHour {
                hour,
                products: 0,
                bytes: 0,
                latency_mean_s: 0.0,
                latency_max_s: 0.0,
            });
            let total = bin.products + products;
            if total > 0 {
                bin.latency_mean_s = (bin.latency_mean_s * bin.products as f64 + mean * products as f64) / total as f64;
            }
            bin.products = total;
            bin.bytes += bytes;
            bin.latency_max_s = bin.latency_max_s.max(max);
        }
        Ok(hours.into_values().collect())
    }

    /// A link's minutes in `[from, to)`, oldest first.
    pub async fn minutes(
        &self,
        link: &Link,
        from: Minute,
        to: Minute,
    ) -> Result<Vec<(Minute, MinuteSums)>, StoreError> {
        let sql = format!(
            "SELECT minute, {} FROM link_minutes WHERE feed = $1 AND publisher = $2 AND subscriber = $3 \
             AND minute >= $4 AND minute < $5 ORDER BY minute",
            MinuteSums::NAMES.join(", ")
        );
        let rows = sqlx::query(&sql)
            .bind(link.feed.clone())
            .bind(link.publisher.clone())
            .bind(link.subscriber.clone())
            .bind(from.0)
            .bind(to.0)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| Ok((Minute(row.try_get("minute")?), sums_from(row)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;

    /// The embedded list is the migrations directory: every file, in order, named by its entry.
    #[test]
    fn the_embedded_migrations_are_the_files_of_the_migrations_directory() {
        let directory = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut files: Vec<String> = std::fs::read_dir(&directory)
            .expect("the migrations directory")
            .map(|entry| entry.expect("an entry").file_name().into_string().expect("a UTF-8 name"))
            .collect();
        files.sort();
        let named: Vec<String> =
            MIGRATIONS.0.iter().map(|(version, description, _)| format!("{version}_{description}.sql")).collect();
        assert_eq!(named, files);
        for (file, (_, _, sql)) in files.iter().zip(MIGRATIONS.0) {
            let text = std::fs::read_to_string(directory.join(file)).expect("a migration");
            assert_eq!(&text, sql, "{file}");
            assert!(!sql.starts_with("-- no-transaction"), "{file}: every migration runs in a transaction");
        }
    }
}
