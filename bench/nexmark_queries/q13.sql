-- -------------------------------------------------------------------------------------------------
-- Query 13: Bounded Side Input Join (Not in original suite)
-- -------------------------------------------------------------------------------------------------
-- Joins a stream to a bounded side input, modeling basic stream enrichment.
-- -------------------------------------------------------------------------------------------------

-- TODO: use the new "filesystem" connector once FLINK-17397 is done
-- Strata: the side input's source DDL adapted: a PostgreSQL table instead of a CSV file,
-- versioned (a validity column in its primary key) so that FOR SYSTEM_TIME AS OF the event
-- time finds the version valid then; the harness loads each key with one version valid
-- since the epoch.
CREATE TABLE side_input (
  key BIGINT,
  `value` VARCHAR,
  valid_from TIMESTAMPTZ,
  PRIMARY KEY (key, valid_from)
);

CREATE TABLE nexmark_q13 (
  auction  BIGINT,
  bidder  BIGINT,
  price  BIGINT,
  `dateTime`  TIMESTAMP(3),
  `value`  VARCHAR
) WITH (
  'connector' = 'blackhole'
);

INSERT INTO nexmark_q13
SELECT
    B.auction,
    B.bidder,
    B.price,
    B.`dateTime`,
    S.`value`
-- Strata: PROCTIME() changed to event time (`dateTime`), as in q12.
FROM (SELECT *, `dateTime` as p_time FROM bid) B
JOIN side_input FOR SYSTEM_TIME AS OF B.p_time AS S
ON mod(B.auction, 10000) = S.key;