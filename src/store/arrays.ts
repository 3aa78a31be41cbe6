/**
 * PostgreSQL array literals for parameters, written in one pass. pg's generic array serialisation
 * quotes and escapes every element and formats every Date in local time; on the push path
 * (attempt rows in batches of hundreds) that was ~5% of the broker's CPU. Timestamps go as epoch
 * milliseconds and become timestamptz in SQL: `to_timestamp(ms / 1000)` is exact to the
 * millisecond for any date a broker writes (float8 holds them to well under a microsecond).
 *
 * The `...Column` forms read one field of each row, so a statement's columns are written without
 * an array of values for each first (a dozen columns of hundreds of rows per attempt-log flush).
 */

/** `{1,2,NULL}` for `$n::int[]`, `::bigint[]` or `::float8[]` of `get` of each row; null and undefined become NULL. */
export function numberColumn<T>(rows: readonly T[], get: (row: T) => number | null | undefined): string {
  let s = '{'
  for (let i = 0; i < rows.length; i++) {
    const v = get(rows[i]!)
    if (i > 0) s += ','
    if (v === null || v === undefined) s += 'NULL'
    else if (Number.isFinite(v)) s += v
    else throw new TypeError(`not a finite number: ${v}`)
  }
  return `${s}}`
}

const NEEDS_ESCAPE = /["\\]/
const ESCAPED = /["\\]/g

/**
 * `{"a","b",NULL}` for `$n::text[]` of `get` of each row. Every element is quoted (so commas,
 * braces, spaces and the word NULL stay text); only `"` and `\` need escaping inside the quotes.
 */
export function textColumn<T>(rows: readonly T[], get: (row: T) => string | null | undefined): string {
  let s = '{'
  for (let i = 0; i < rows.length; i++) {
    const v = get(rows[i]!)
    if (i > 0) s += ','
    if (v === null || v === undefined) s += 'NULL'
    else s += NEEDS_ESCAPE.test(v) ? `"${v.replace(ESCAPED, '\\$&')}"` : `"${v}"`
  }
  return `${s}}`
}

const itself = <T>(v: T): T => v

/** `{1,2,NULL}` for `$n::int[]`, `::bigint[]` or `::float8[]`; null and undefined become NULL. */
export function numberArray(values: readonly (number | null | undefined)[]): string {
  return numberColumn(values, itself)
}

/** Epoch milliseconds of each date, as numberArray: pair with `to_timestamp(x / 1000)` in SQL. */
export function epochMsArray(dates: readonly (Date | null | undefined)[]): string {
  return numberColumn(dates, (d) => d?.getTime())
}
