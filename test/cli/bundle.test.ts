// The CLI's bundle (scripts/server-bundle.mjs): a command loads only the packages it uses. In one
// file every package import is hoisted to the top, so what `groups` imports lazily (typebox, 0.2 s)
// loaded at every command; split, it loads with `groups` alone. Also: the broker's bundle does not
// load PGlite when it runs on PostgreSQL.
import t from '../helpers/tap.ts'
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { cliBundle, pruneBundles, serverBundle } from '../../scripts/server-bundle.mjs'

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

  const cliEntry = await cliBundle()
  const cliText = readFileSync(cliEntry, 'utf8')
  const lazy = [...cliText.matchAll(/import\(["']\.\/(chunk-[\w-]+\.mjs)["']\)/g)].map((m) => m[1]!)
  t.ok(lazy.length > 0, "groups' code is a chunk imported when used")
  const lazyPackages = new Set(lazy.flatMap((c) => [...staticPackages(join(dirname(cliEntry), c))]))
  t.ok(lazyPackages.has('typebox'), `a chunk imported when used loads typebox (${[...lazyPackages].join(', ')})`)

  const server = staticPackages(await serverBundle())
  t.ok(server.has('fastify'), 'the broker loads fastify at start')
  t.notOk(server.has('@electric-sql/pglite'), 'PGlite is not loaded at start (only for the embedded database)')
})

t.test('old bundles are pruned: the newest three stay, older ones once a day old, stale temporary folders', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'hookq-bundles-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const now = Date.now()
  const hour = 3600_000
  const make = (name: string, ageMs: number) => {
    mkdirSync(join(dir, name))
    writeFileSync(join(dir, name, 'index.mjs'), '')
    const at = (now - ageMs) / 1000
    utimesSync(join(dir, name), at, at)
  }
  const hash = (i: number) => i.toString(16).padStart(16, '0')
  // Five server bundles: 1 hour, 2, 3, 4 days and 100 hours old.
  make(`server-${hash(1)}`, hour)
  make(`server-${hash(2)}`, 48 * hour)
  make(`server-${hash(3)}`, 72 * hour)
  make(`server-${hash(4)}`, 96 * hour)
  make(`server-${hash(5)}`, 100 * hour)
  make(`server-${hash(6)}.4242.tmp`, 2 * hour) // a killed build's
  make(`server-${hash(7)}.4243.tmp`, 60_000) // a build under way
  make(`cli-${hash(8)}`, 200 * hour) // another name: not this call's
  make('unrelated', 200 * hour)

  pruneBundles(dir, 'server', now)
  const left = (name: string) => existsSync(join(dir, name))
  t.ok(left(`server-${hash(1)}`) && left(`server-${hash(2)}`) && left(`server-${hash(3)}`), 'the three newest stay')
  t.notOk(left(`server-${hash(4)}`), 'an older one past a day is removed')
  t.notOk(left(`server-${hash(5)}`), 'and the oldest')
  t.notOk(left(`server-${hash(6)}.4242.tmp`), "a killed build's temporary folder is removed")
  t.ok(left(`server-${hash(7)}.4243.tmp`), 'a build under way is left alone')
  t.ok(left(`cli-${hash(8)}`) && left('unrelated'), 'other names are left alone')

  // A newer bundle pushes the 3-day-old one out of the newest three: it goes.
  make(`server-${hash(9)}`, 10 * hour)
  pruneBundles(dir, 'server', now)
  t.ok(left(`server-${hash(9)}`) && left(`server-${hash(2)}`), 'the newest three stay')
  t.notOk(left(`server-${hash(3)}`), 'the fourth newest, 3 days old, is removed')
  // Young bundles beyond the newest three stay: a process started from one may still load a chunk of it.
  make(`server-${hash(10)}`, 2 * hour)
  make(`server-${hash(11)}`, 3 * hour)
  pruneBundles(dir, 'server', now)
  t.ok(left(`server-${hash(9)}`) && left(`server-${hash(11)}`), 'nothing under a day old is removed')
  t.notOk(left(`server-${hash(2)}`), 'the 2-day-old one, now fifth, is removed')
  pruneBundles(join(dir, 'missing'), 'server', now) // no folder: nothing to do, no error
})

t.test("the CLI's copy of the bundler (it builds the broker's bundle for `hookq serve`) still replaces import.meta.url", async (t) => {
  // Bundled, the bundler's own source has its import.meta.url replaced too: a search for the
  // expression written as a string became a search for the bundler's URL, and the broker bundles
  // built by `hookq serve` kept their import.meta.url (their migrations looked for beside the bundle).
  const dir = dirname(await cliBundle())
  const text = readdirSync(dir)
    .filter((f) => f.endsWith('.mjs'))
    .map((f) => readFileSync(join(dir, f), 'utf8'))
    .join('\n')
  t.notMatch(text, /replaceAll\(\s*["']file:/, 'no search for a file URL')
  t.match(text, /\\bimport\\\.meta\\\.url\\b/, 'the pattern for the expression is intact')
})
