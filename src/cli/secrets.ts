/**
 * `hookq secrets rotate` and `hookq jwks rotate`: operations on the broker's database itself
 * (DATABASE_URL and the HOOKQ_SECRETS_KEY variables, as the broker reads them), not through its API:
 * the keys they use never travel over HTTP. Their work is in secrets-ops.ts, loaded only when run.
 */
import type { Command } from 'commander'
import { wholeNumber } from './args.ts'

/** Adds `secrets` and `jwks` to `program`. */
export function registerSecrets(program: Command): void {
  const secrets = program
    .command('secrets')
    .description('secret values at rest in the database (DATABASE_URL, HOOKQ_SECRETS_KEY, HOOKQ_SECRETS_KEY_PREVIOUS)')
  secrets
    .command('rotate')
    .description(
      'seal every stored secret with HOOKQ_SECRETS_KEY: clear values, and values sealed with a key of HOOKQ_SECRETS_KEY_PREVIOUS; online, brokers keep running',
    )
    .action(async (_opts: unknown, cmd: Command) => {
      const { rotateSecrets } = await import('./secrets-ops.ts')
      await rotateSecrets(Boolean(cmd.optsWithGlobals().json))
    })
  const jwks = program.command('jwks').description("the keys of the broker's push JWTs (consumer auth type jwt)")
  jwks
    .command('rotate')
    .description(
      'add a signing key: listed in /.well-known/jwks.json now, signing after --propagation-ms; the current key stays listed until its tokens expire',
    )
    .option(
      '--propagation-ms <ms>',
      'how long the new key is listed before it signs (default 600000; more than HOOKQ_JWT_KEYS_REFRESH_MS)',
      wholeNumber(1),
    )
    .action(async (opts: { propagationMs?: number }, cmd: Command) => {
      const { rotateJwks } = await import('./secrets-ops.ts')
      await rotateJwks(opts.propagationMs, Boolean(cmd.optsWithGlobals().json))
    })
}
