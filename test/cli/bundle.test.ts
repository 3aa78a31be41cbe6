// The CLI's bundle (scripts/server-bundle.mjs): a command loads only the packages it uses. In one
// file every package import is hoisted to the top, so what `groups` imports lazily (typebox, 0.2 s)
// loaded at every command; split, it loads with `groups` alone. Also: the broker's bundle does not
// load PGlite when it runs on PostgreSQL.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { cliBundle, serverBundle } from '../../scripts/server-bundle.mjs'

/** The packages a bundle's entry loads before any of its code runs: its static imports, chunks followed. */
function staticPackages(entry: string): Set<string> {
  const packages = new Set<string>()
  const seen = new Set<string>()
  const visit = (file: string) => {
    if (seen.has(file)) return
    seen.add(file)
    const text = readFileSync(file, 'utf8')
    // Static imports only: `import ... from "x"` and `import "x"` at the start of a line (esbuild's output).
    for (const m of text.matchAll(/^import\s+(?:[^'";]*?\s+from\s+)?["']([^"']+)["'];?$/gms)) {
      const spec = m[1]!
      if (spec.startsWith('./')) visit(join(dirname(file), spec))
      else if (!spec.startsWith('node:')) packages.add(spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!)
    }
  }
  visit(entry)
  return packages
}

t.test('the CLI loads typebox only for groups; the broker loads PGlite only when embedded', async (t) => {
  const cli = staticPackages(await cliBundle())
  t.ok(cli.has('commander'), `the CLI's start loads commander (${[...cli].join(', ')})`)
  t.notOk(cli.has('typebox'), 'typebox is not loaded at every command')
  t.notOk(cli.has('@hookq/client'), 'the SDK is bundled in, not loaded from node_modules')

  const cliText = readFileSync(await cliBundle(), 'utf8')
  t.match(cliText, /import\(["']\.\/chunk-[\w-]+\.mjs["']\)/, "groups' code is a chunk imported when used")

  const server = staticPackages(await serverBundle())
  t.ok(server.has('fastify'), 'the broker loads fastify at start')
  t.notOk(server.has('@electric-sql/pglite'), 'PGlite is not loaded at start (only for the embedded database)')
})
