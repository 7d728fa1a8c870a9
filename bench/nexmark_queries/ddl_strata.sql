-- The source DDL, adapted to Strata (this file is not part of nexmark/nexmark).
--
-- nexmark-flink declares one generator table (ddl_gen.sql: the 'nexmark' connector, an
-- event_type and a ROW per kind of event, the watermark 4 seconds behind `dateTime`) and a
-- view per kind of event over it (ddl_views.sql: person, auction, bid). Strata's sources
-- are raw streams, one per kind of event, with the same columns and the same event time.
-- Types: VARCHAR is text and TIMESTAMP(3) is timestamptz (the runs carry UTC times).
-- Names: in lower case (Strata's column names are lower case): PostgreSQL folds the
-- queries' unquoted names (dateTime is datetime) and Spark compares names ignoring case.
-- The watermark's 4 seconds are the streams' delay; late rows are taken all the same.

CREATE STREAM person (
  id  BIGINT,
  name  VARCHAR,
  emailaddress  VARCHAR,
  creditcard  VARCHAR,
  city  VARCHAR,
  state  VARCHAR,
  datetime  TIMESTAMPTZ,
  extra  VARCHAR
) WITH (event_time = 'datetime', delay = '4 seconds');

CREATE STREAM auction (
  id  BIGINT,
  itemname  VARCHAR,
  description  VARCHAR,
  initialbid  BIGINT,
  reserve  BIGINT,
  datetime  TIMESTAMPTZ,
  expires  TIMESTAMPTZ,
  seller  BIGINT,
  category  BIGINT,
  extra  VARCHAR
) WITH (event_time = 'datetime', delay = '4 seconds');

CREATE STREAM bid (
  auction  BIGINT,
  bidder  BIGINT,
  price  BIGINT,
  channel  VARCHAR,
  url  VARCHAR,
  datetime  TIMESTAMPTZ,
  extra  VARCHAR
) WITH (event_time = 'datetime', delay = '4 seconds');
