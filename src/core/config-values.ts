/**
 * The pieces of configuration parsing that other modules' own settings use too (the URL policy
 * reads its variables with them): a leaf, so src/config.ts can import those modules back.
 */

/** The environment, as loadConfig reads it. */
export type Env = Record<string, string | undefined>

/** A bad setting: the broker says which and exits 2 (src/server.ts). */
export class ConfigError extends Error {
  override name = 'ConfigError'
}

/** A true/false variable (also 1/0, yes/no); `fallback` when unset. */
export function bool(env: Env, name: string, fallback: boolean): boolean {
  const raw = env[name]?.trim().toLowerCase()
  if (raw === undefined || raw === '') return fallback
  if (raw === 'true' || raw === '1' || raw === 'yes') return true
  if (raw === 'false' || raw === '0' || raw === 'no') return false
  throw new ConfigError(`${name} must be true or false, got ${JSON.stringify(env[name])}`)
}
