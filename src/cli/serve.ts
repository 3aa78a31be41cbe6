/**
 * `hookq serve`: start the broker exactly as `npm start` does, by loading the bundle of
 * src/server.ts (scripts/server-bundle.mjs; the source itself where it cannot be built), which
 * reads its configuration from the environment, listens, and handles SIGTERM/SIGINT. The flags
 * only set the environment variables the configuration reads, so flags and variables mean the same.
 */
import { pathToFileURL } from 'node:url'
import type { Command } from 'commander'
import { serverBundle } from '../../scripts/server-bundle.mjs'
import { wholeNumber } from './args.ts'

interface ServeOptions {
  port?: number
  host?: string
  dataDir?: string
  logLevel?: string
}

/** Adds `serve` to `program`. */
export function registerServe(program: Command): void {
  program
    .command('serve')
    .description('start the broker (like npm start); configured by HOST, PORT, DATABASE_URL and the HOOKQ_* variables')
    .option('--port <port>', 'port to listen on (sets PORT; default 8080)', wholeNumber(0, 65_535))
    .option('--host <host>', 'address to listen on (sets HOST; default 127.0.0.1)')
    .option('--data-dir <dir>', 'directory of the embedded database when DATABASE_URL is not set (sets HOOKQ_DATA_DIR)')
    .option('--log-level <level>', 'fatal, error, warn, info, debug, trace or silent (sets LOG_LEVEL)')
    .addHelpText('after', '\nEvery other setting comes from the environment; see docs/configuration.md.')
    .action(async (opts: ServeOptions) => {
      if (opts.port !== undefined) process.env.PORT = String(opts.port)
      if (opts.host !== undefined) process.env.HOST = opts.host
      if (opts.dataDir !== undefined) process.env.HOOKQ_DATA_DIR = opts.dataDir
      if (opts.logLevel !== undefined) process.env.LOG_LEVEL = opts.logLevel
      // Stack traces name the .ts files, as under npm start's --enable-source-maps.
      process.setSourceMapsEnabled(true)
      const bundle = await serverBundle().catch((err: unknown) => {
        console.error(`hookq: running src/ through tsx, as the bundle could not be built: ${err instanceof Error ? err.message : err}`)
        return undefined
      })
      // server.ts starts everything at import and owns the process from then on (signals, exit codes).
      // Its URL is computed, not written out: the CLI's own bundle must not carry the whole broker.
      await import(bundle ? pathToFileURL(bundle).href : new URL('../server.ts', import.meta.url).href)
    })
}
