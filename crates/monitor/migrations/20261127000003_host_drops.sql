-- Multicast datagrams dropped at the subscriber's host (its socket buffer was full), per link
-- and minute; 0 for minutes reported before servers counted them.
ALTER TABLE link_minutes ADD COLUMN host_drops BIGINT NOT NULL DEFAULT 0;
