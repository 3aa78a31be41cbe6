/** The benches' settings from the environment: unset or empty takes the default, anything else must be valid. */

/** A positive number from `name`, or `fallback` when it is unset. */
export function envNumber(name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return fallback
  const n = Number(raw)
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${name} must be a positive number, got ${JSON.stringify(raw)}`)
  return n
}

/** A positive integer from `name`, or `fallback` when it is unset. */
export function envInt(name: string, fallback: number): number {
  const n = envNumber(name, fallback)
  if (!Number.isInteger(n)) throw new Error(`${name} must be a positive integer, got ${JSON.stringify(process.env[name])}`)
  return n
}

/** A whole number from `name` that may be 0 (off), or `fallback` when it is unset. */
export function envCount(name: string, fallback: number): number {
  if (process.env[name] === '0') return 0
  return envInt(name, fallback)
}

/** A comma-separated list from `name` (`fallback` when unset or empty), trimmed, empty items dropped. */
export function envList(name: string, fallback: string): string[] {
  return (process.env[name] || fallback)
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
}

/** The PostgreSQL server the benches make their throw-away databases on. */
export const SERVER_URL = process.env.BENCH_DATABASE_URL || process.env.DATABASE_URL || 'postgresql://postgres@127.0.0.1:5432/postgres'
