/**
 * PostgreSQL array literals for numeric parameters, written in one pass. pg's generic array
 * serialisation quotes and escapes every element and formats every Date in local time; on the
 * push path (attempt rows in batches of hundreds) that was ~5% of the broker's CPU. Timestamps go
 * as epoch milliseconds and become timestamptz in SQL: `to_timestamp(ms / 1000)` is exact to the
 * millisecond for any date a broker writes (float8 holds them to well under a microsecond).
 */

/** `{1,2,NULL}` for `$n::int[]`, `::bigint[]` or `::float8[]`; null and undefined become NULL. */
export function numberArray(values: readonly (number | null | undefined)[]): string {
  let s = '{'
  for (let i = 0; i < values.length; i++) {
    const v = values[i]
    if (i > 0) s += ','
    if (v === null || v === undefined) s += 'NULL'
    else if (Number.isFinite(v)) s += v
    else throw new TypeError(`not a finite number: ${v}`)
  }
  return `${s}}`
}

/** Epoch milliseconds of each date, as numberArray: pair with `to_timestamp(x / 1000)` in SQL. */
export function epochMsArray(dates: readonly (Date | null | undefined)[]): string {
  return numberArray(dates.map((d) => (d ? d.getTime() : null)))
}
