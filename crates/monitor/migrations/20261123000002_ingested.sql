-- Products already stored (by signature), so a product received twice — from two upstreams,
-- or read again after a restart — is counted once.
CREATE TABLE ingested (
    signature TEXT PRIMARY KEY,
    at BIGINT NOT NULL
);
