/**
 * Points in time a caller gives (a group's `startAt`, seek's `timestamp`): RFC 3339 date-times
 * (`2026-01-01T00:00:00Z`, `2026-01-01T01:00:00+01:00`), nothing looser. `Date.parse` alone also
 * takes "2026", "Thu, 01 Jan 2026 00:00:00 GMT" and years like -271821 that PostgreSQL cannot
 * store (a 500 when they reached a query).
 */
import { fullFormats } from 'ajv-formats/dist/formats.js'

// The same check as the schemas' `format: "date-time"` (ajv-formats), so body and service agree.
const isDateTime = (fullFormats['date-time'] as { validate: (s: string) => boolean }).validate

// PostgreSQL's timestamptz runs from 4713 BC (astronomical year -4712) to 294276 AD, past the
// largest JS Date (275760 AD); RFC 3339's four-digit years stay inside it, this bound says so.
const PG_MIN_MS = Date.UTC(-4712, 10, 24)

/** The instant an RFC 3339 date-time names, or undefined when it is not one PostgreSQL can store. */
export function parseInstant(text: string): Date | undefined {
  if (!isDateTime(text)) return undefined
  // Ajv accepts the leap second 23:59:60, which Date cannot represent (NaN).
  const ms = Date.parse(text)
  return Number.isNaN(ms) || ms < PG_MIN_MS ? undefined : new Date(ms)
}
