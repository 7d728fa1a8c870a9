-- Reduce and final forms of the aggregates whose partial states a plain SUM/MIN/MAX cannot
-- merge (rewriter/registry.py documents each state). A reduce aggregate maps partial states
-- to one partial state of the same form; a final function maps a merged state to the answer
-- PostgreSQL itself gives. Installed at every start with the rest of sql/, so re-runnable
-- (sql/001_functions.sql says how).

-- ---------------------------------------------------------------------------------------
-- Moments: stddev, stddev_samp, stddev_pop, variance, var_samp, var_pop.
--
-- numeric[] {N, Sx, Sxx} for integer and numeric input: N rows, Sx = sum(x), Sxx =
-- sum(x * x), all exact, with the display scales PostgreSQL's own numeric accumulator keeps
-- (Sx at the input's scale, Sxx at twice it). Merging adds them.
-- double precision[] {N, Sx, Sxx} for real and double precision input: PostgreSQL's own
-- float8 transition state, Sxx being the sum of squared deviations from the mean (Youngs-
-- Cramer); merged by PostgreSQL's own float8_combine (Chan et al.'s parallel formula).
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION public.strata_moments_add(a numeric[], b numeric[])
RETURNS numeric[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT ARRAY[a[1] + b[1], a[2] + b[2], a[3] + b[3]]
$$;

CREATE OR REPLACE AGGREGATE public.strata_moments_merge(numeric[]) (
  SFUNC = public.strata_moments_add,
  STYPE = numeric[],
  COMBINEFUNC = public.strata_moments_add,
  PARALLEL = SAFE
);

CREATE OR REPLACE AGGREGATE public.strata_moments_merge(double precision[]) (
  SFUNC = float8_combine,
  STYPE = double precision[],
  INITCOND = '{0,0,0}',
  COMBINEFUNC = float8_combine,
  PARALLEL = SAFE
);

-- The variance of numeric moments, digit for digit as PostgreSQL's numeric_stddev_internal
-- computes it: (N * Sxx - Sx * Sx) / (N * (N - 1)) (or N * N), divided at the scale
-- numeric division chooses; 0 (scale 0) when the numerator is not positive.
CREATE OR REPLACE FUNCTION public.strata_numeric_variance(moments numeric[], sample boolean)
RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT CASE
           WHEN n = 0 OR (sample AND n = 1) THEN NULL
           WHEN numerator <= 0 THEN 0
           ELSE numerator / (n * (n - CASE WHEN sample THEN 1 ELSE 0 END))
         END
  FROM (SELECT moments[1] AS n,
               moments[1] * moments[3] - moments[2] * moments[2] AS numerator) AS parts
$$;

-- sqrt(v) rounded half away from zero to v's own scale, as PostgreSQL's numeric stddev
-- rounds (sqrt() alone would choose another scale). The square root is taken 8 digits
-- finer and then corrected exactly, so a double rounding can never change the last digit.
CREATE OR REPLACE FUNCTION public.strata_numeric_sqrt_at_scale(v numeric)
RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT CASE
           WHEN r > 0 AND (r - half) * (r - half) > v THEN round(r - 2 * half, scale(v))
           WHEN (r + half) * (r + half) <= v THEN round(r + 2 * half, scale(v))
           ELSE r
         END
  FROM (SELECT round(sqrt(round(v, scale(v) + 8)), scale(v)) AS r,
               0.5 * power(10::numeric, -scale(v)) AS half) AS candidate
$$;

CREATE OR REPLACE FUNCTION public.strata_var_samp(moments numeric[]) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT public.strata_numeric_variance(moments, true) $$;

CREATE OR REPLACE FUNCTION public.strata_var_pop(moments numeric[]) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT public.strata_numeric_variance(moments, false) $$;

CREATE OR REPLACE FUNCTION public.strata_stddev_samp(moments numeric[]) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT public.strata_numeric_sqrt_at_scale(public.strata_numeric_variance(moments, true)) $$;

CREATE OR REPLACE FUNCTION public.strata_stddev_pop(moments numeric[]) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT public.strata_numeric_sqrt_at_scale(public.strata_numeric_variance(moments, false)) $$;

CREATE OR REPLACE FUNCTION public.strata_var_samp(moments double precision[])
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT float8_var_samp(moments) $$;

CREATE OR REPLACE FUNCTION public.strata_var_pop(moments double precision[])
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT float8_var_pop(moments) $$;

CREATE OR REPLACE FUNCTION public.strata_stddev_samp(moments double precision[])
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT float8_stddev_samp(moments) $$;

CREATE OR REPLACE FUNCTION public.strata_stddev_pop(moments double precision[])
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT float8_stddev_pop(moments) $$;

-- ---------------------------------------------------------------------------------------
-- Sets: count(DISTINCT x). A state is the array of the distinct non-NULL values of a run
-- (timestamps as epoch microseconds, dates as epoch days); merging is the union.
-- ---------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION public.strata_array_distinct(elements anycompatiblearray)
RETURNS anycompatiblearray
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT coalesce(array_agg(DISTINCT e ORDER BY e), elements[0:0]) FROM unnest(elements) AS e
$$;

CREATE OR REPLACE AGGREGATE public.strata_set_union(anycompatiblearray) (
  SFUNC = array_cat,
  STYPE = anycompatiblearray,
  FINALFUNC = public.strata_array_distinct,
  PARALLEL = SAFE
);

-- ---------------------------------------------------------------------------------------
-- KMV sketches: approx_count_distinct(x). A state is the sorted array of the k = 1024
-- smallest distinct 64-bit hashes (Spark's xxhash64) of the values; merging keeps the k
-- smallest of the union. Fewer than k hashes: the exact count. Otherwise (k - 1) / U_k,
-- U_k being the k-th smallest hash mapped onto (0, 1]: relative standard error
-- 1 / sqrt(k - 2) = 3.1%.
-- ---------------------------------------------------------------------------------------

-- Two KMV states merged (the union's transition before strata_kmv_gather; kept for
-- merging states by hand).
CREATE OR REPLACE FUNCTION public.strata_kmv_add(sketch bigint[], hashes bigint[])
RETURNS bigint[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT coalesce(array_agg(h ORDER BY h), '{}')
  FROM (SELECT DISTINCT h FROM unnest(sketch || hashes) AS h ORDER BY h LIMIT 1024) AS smallest
$$;

-- The k smallest distinct hashes of any array of hashes, sorted: a KMV state.
CREATE OR REPLACE FUNCTION public.strata_kmv_compact(hashes bigint[])
RETURNS bigint[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT coalesce(array_agg(h ORDER BY h), '{}')
  FROM (SELECT DISTINCT h FROM unnest(hashes) AS h ORDER BY h LIMIT 1024) AS smallest
$$;

-- The union's transition: the states are gathered as they come (a concatenation, the cheap
-- path of PL/pgSQL, not a query per row) and compacted once at the end, or whenever more
-- than two full states' worth are gathered, so that a group of many states takes bounded
-- memory and time linear in its states. A view merging late partial rows calls it per
-- row: with small states, a query per row (strata_kmv_add) took 1.6-3.4 times as long;
-- with full ones (1,024 hashes) both take about the same.
CREATE OR REPLACE FUNCTION public.strata_kmv_gather(gathered bigint[], hashes bigint[])
RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
  IF cardinality(gathered) + cardinality(hashes) <= 2048 THEN
    RETURN gathered || hashes;
  END IF;
  RETURN public.strata_kmv_compact(gathered || hashes);
END
$$;

CREATE OR REPLACE AGGREGATE public.strata_kmv_union(bigint[]) (
  SFUNC = public.strata_kmv_gather,
  STYPE = bigint[],
  INITCOND = '{}',
  FINALFUNC = public.strata_kmv_compact,
  COMBINEFUNC = public.strata_kmv_gather,
  PARALLEL = SAFE
);

CREATE OR REPLACE FUNCTION public.strata_kmv_estimate(sketch bigint[])
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT CASE
           WHEN cardinality(sketch) < 1024 THEN cardinality(sketch)
           -- (k - 1) / ((h_k + 2^63 + 1) / 2^64)
           ELSE round(1023 * 18446744073709551616
                      / (sketch[1024]::numeric + 9223372036854775809))::bigint
         END
$$;

-- ---------------------------------------------------------------------------------------
-- DDSketch: approx_percentile(x, p). A state is a jsonb object {"bucket": count}. With
-- alpha = 0.01 and gamma = (1 + alpha) / (1 - alpha), x > 0 falls into bucket
-- 100000 + ceil(ln(x) / ln(gamma)), x < 0 into -(100000 + ceil(ln(-x) / ln(gamma))), 0 into
-- bucket 0: buckets sort as their values do. Merging adds the counts per bucket. A bucket
-- stands for +-2 gamma^i / (gamma + 1), within alpha (relative) of every value in it.
-- ---------------------------------------------------------------------------------------

-- The bucket of x, as Spark computes it in the partial query (for inspecting sketches; on
-- a bucket's very edge the engines' ln() may differ in the last bit and pick the neighbour).
CREATE OR REPLACE FUNCTION public.strata_ddsketch_bucket(x double precision)
RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT CASE
           WHEN x > 0 THEN 100000 + least(ceil(ln(x) / 0.020000666706669435), 40000)::integer
           WHEN x < 0 THEN -100000 - least(ceil(ln(-x) / 0.020000666706669435), 40000)::integer
           WHEN x = 0 THEN 0
         END
$$;

-- The value a bucket stands for: 2 gamma^i / (gamma + 1) = (1 - alpha) gamma^i. Computed
-- as two halves, so that no step overflows or underflows for any finite double; bucket
-- +-140000 holds the infinities.
CREATE OR REPLACE FUNCTION public.strata_ddsketch_value(bucket integer)
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT CASE
           WHEN bucket = 0 THEN 0
           WHEN abs(bucket) >= 140000 THEN sign(bucket) * 'Infinity'::double precision
           ELSE sign(bucket) * (0.99 * exp(half_exponent)) * exp(half_exponent)
         END
  FROM (SELECT (abs(bucket) - 100000) * 0.020000666706669435::double precision / 2
               AS half_exponent) AS parts
$$;

-- Two sketches merged (the merge's transition before strata_ddsketch_gather; kept for
-- merging sketches by hand).
CREATE OR REPLACE FUNCTION public.strata_ddsketch_add(sketch jsonb, buckets jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT coalesce(jsonb_object_agg(key, total), '{}')
  FROM (SELECT key, sum(value::bigint) AS total
        FROM (SELECT * FROM jsonb_each_text(sketch)
              UNION ALL
              SELECT * FROM jsonb_each_text(buckets)) AS counts
        GROUP BY key) AS merged
$$;

-- The sketch of a jsonb array of sketches: their counts added per bucket.
CREATE OR REPLACE FUNCTION public.strata_ddsketch_sum(sketches jsonb)
RETURNS jsonb
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT coalesce(jsonb_object_agg(counts.key, counts.total), '{}')
  FROM (SELECT c.key, sum(c.value::bigint) AS total
        FROM jsonb_array_elements(sketches) AS s, jsonb_each_text(s.value) AS c
        GROUP BY c.key) AS counts
$$;

-- The merge's transition, as strata_kmv_gather's: the sketches gathered in a jsonb array
-- (|| appends a sketch to it, or joins two such arrays when combining), summed at the end
-- or whenever 64 are gathered (1.3-4.7 times faster than a query per row, strata_ddsketch_add).
CREATE OR REPLACE FUNCTION public.strata_ddsketch_gather(gathered jsonb, sketches jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
  IF jsonb_array_length(gathered) < 64 THEN
    RETURN gathered || sketches;
  END IF;
  RETURN jsonb_build_array(public.strata_ddsketch_sum(gathered || sketches));
END
$$;

CREATE OR REPLACE AGGREGATE public.strata_ddsketch_merge(jsonb) (
  SFUNC = public.strata_ddsketch_gather,
  STYPE = jsonb,
  INITCOND = '[]',
  FINALFUNC = public.strata_ddsketch_sum,
  COMBINEFUNC = public.strata_ddsketch_gather,
  PARALLEL = SAFE
);

-- The value at rank max(1, ceil(fraction * n)) of the n values counted, as
-- percentile_disc(fraction) WITHIN GROUP (ORDER BY x) ranks them; NULL when n = 0.
CREATE OR REPLACE FUNCTION public.strata_ddsketch_quantile(sketch jsonb, fraction double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT public.strata_ddsketch_value(bucket)
  FROM (SELECT key::integer AS bucket,
               sum(value::bigint) OVER (ORDER BY key::integer) AS ranks_so_far,
               sum(value::bigint) OVER () AS n
        FROM jsonb_each_text(sketch)) AS buckets
  WHERE ranks_so_far >= greatest(1, ceil(fraction * n))
  ORDER BY bucket
  LIMIT 1
$$;
