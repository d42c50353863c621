-- Per-minute sums of each link (feed, publisher, subscriber), from statistics products.
CREATE TABLE link_minutes (
    feed TEXT NOT NULL,
    publisher TEXT NOT NULL,
    subscriber TEXT NOT NULL,
    minute BIGINT NOT NULL,
    n BIGINT NOT NULL,
    n_fmtp BIGINT NOT NULL,
    n_mc BIGINT NOT NULL,
    s_all BIGINT NOT NULL,
    s_fmtp BIGINT NOT NULL,
    s_mc BIGINT NOT NULL,
    l_all_us BIGINT NOT NULL,
    l_fmtp_us BIGINT NOT NULL,
    l_mc_us BIGINT NOT NULL,
    retx_blocks BIGINT NOT NULL,
    backstop BIGINT NOT NULL,
    backlog BIGINT NOT NULL,
    latency_max_us BIGINT NOT NULL,
    PRIMARY KEY (feed, publisher, subscriber, minute)
);
CREATE INDEX link_minutes_by_minute ON link_minutes (minute);

-- The last report of each node (Unix seconds) and what kind of report it was.
CREATE TABLE reports (
    node TEXT PRIMARY KEY,
    last_report BIGINT NOT NULL,
    kind TEXT NOT NULL
);

-- Classic LDM 6 rtstats: the latest report of each hourly bin.
CREATE TABLE rtstats (
    host TEXT NOT NULL,
    feed TEXT NOT NULL,
    origin TEXT NOT NULL,
    hour BIGINT NOT NULL,
    products BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    latency_mean_s DOUBLE PRECISION NOT NULL,
    latency_max_s DOUBLE PRECISION NOT NULL,
    reported BIGINT NOT NULL,
    PRIMARY KEY (host, feed, origin, hour)
);

-- Where nodes are (from the monitor's configuration).
CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    latitude DOUBLE PRECISION NOT NULL,
    longitude DOUBLE PRECISION NOT NULL
);
