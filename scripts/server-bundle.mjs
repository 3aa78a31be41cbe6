// The broker as `npm start` runs it, and the `hookq` CLI: an entry of src/ and everything it imports
// from the project, bundled by esbuild (the compiler tsx itself runs on) into one ES module with a
// source map; packages stay external and load from node_modules. Plain JavaScript: the launchers
// (scripts/start.mjs, src/cli/hookq.mjs) use it before any TypeScript loader is there, and the
// process tests (test/helpers/process.ts) use it too.
//
// Why a bundle and not `node --import tsx src/server.ts`:
// - tsx compiles with esbuild's keepNames, which wraps every function and class made at run time in
//   a call that sets its name: on the push path, closures made per push paid for it (the broker ~7%
//   dearer per message under tsx than bundled; figures: docs/performance.md#memory-and-garbage).
// - Start-up: tsx resolves, reads and compiles each of ~150 files through loader hooks answering
//   from a thread of their own; spawn to listening took 3.3 s under tsx and 1.8 s bundled, and
//   `hookq --help` 0.5 s of CPU under tsx (a CLI pays its start at every command).
//
// A bundle is built once for each state of its sources (a folder named by a hash of the folders it
// is built from, so an edit makes a new one) under node_modules/.cache/hookq, inside the project so
// its bare imports resolve to the project's node_modules. It is written under a temporary name and
// renamed: processes building it at once (cluster workers, test files, CLI commands) never see a
// half-written one. Building one prunes the older ones of its name (pruneBundles). The source's
// `import.meta.url` is replaced file by file with that file's own URL, so what a file finds next to
// itself (prisma/migrations, the console's files, package.json) it finds where it did.
import { createHash } from 'node:crypto'
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { join, relative } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

// A pattern, not the string: a bundle of this file (the CLI's, which builds the server's for `hookq
// serve`; a test's) replaces the expression in it too, and a string of it here would be replaced by
// this file's URL, leaving the bundles built from that copy with their import.meta.url unreplaced.
const IMPORT_META_URL = /\bimport\.meta\.url\b/g

const ROOT = fileURLToPath(new URL('../', import.meta.url))
const OUT_DIR = join(ROOT, 'node_modules/.cache/hookq')

/** The path of the bundle of src/server.ts as it is now, built first if no process has built it yet. */
export function serverBundle() {
  return bundle('server', 'src/server.ts', ['src'])
}

/**
 * The path of the bundle of the CLI (src/cli/main.ts, exporting `main`), built first if no process
 * has built it yet. The SDK it calls the broker with (@hookq/client, TypeScript in
 * clients/typescript) is bundled in: it has no JavaScript build of its own in the checkout.
 */
export function cliBundle() {
  return bundle('cli', 'src/cli/main.ts', ['src', 'clients/typescript/src'], [/^@hookq\/client(\/|$)/])
}

/**
 * @param {string} name  the file's name before its hash
 * @param {string} entry  the entry point, relative to the project
 * @param {string[]} dirs  the folders whose files the bundle is built from (hashed)
 * @param {RegExp[]} inline  packages bundled in instead of left to node_modules
 */
async function bundle(name, entry, dirs, inline = []) {
  const dir = join(OUT_DIR, `${name}-${sourceHash(dirs)}`)
  const file = join(dir, 'index.mjs')
  try {
    statSync(file)
    return file
  } catch {}
  const { build } = await import('esbuild')
  const out = await build({
    entryPoints: { index: join(ROOT, entry) },
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    // What a module imports lazily (the CLI's groups command and its schemas) goes to a chunk of its
    // own, so that its packages load only when it does: in one file, every package import is
    // hoisted to the top and loads at every start (typebox alone took 0.2 s of each CLI command).
    splitting: true,
    outdir: dir,
    outExtension: { '.js': '.mjs' },
    chunkNames: 'chunk-[hash]',
    sourcemap: 'linked',
    write: false,
    logLevel: 'silent',
    plugins: [
      {
        // Packages load from node_modules (esbuild's packages: 'external'), but those named in `inline`.
        name: 'packages-external',
        setup(b) {
          b.onResolve({ filter: /^[^./]/ }, (args) => {
            if (args.path.startsWith('node:') || !inline.some((re) => re.test(args.path))) return { path: args.path, external: true }
            return undefined
          })
        },
      },
      {
        name: 'own-import-meta-url',
        setup(b) {
          // The project's own files, not the packages': TypeScript, and the plain modules of scripts/.
          b.onLoad({ filter: /\.(ts|mjs)$/ }, (args) => {
            if (args.path.includes('/node_modules/')) return undefined
            return {
              contents: readFileSync(args.path, 'utf8').replaceAll(IMPORT_META_URL, JSON.stringify(pathToFileURL(args.path).href)),
              loader: args.path.endsWith('.ts') ? 'ts' : 'js',
            }
          })
        },
      },
    ],
  })
  // Written whole into a folder of this process's, then renamed into place: a process that finds
  // the folder finds every file in it. Another process may have put its own there first: same
  // sources, same bundle, so that one is used.
  const tmp = `${dir}.${process.pid}.tmp`
  rmSync(tmp, { recursive: true, force: true })
  mkdirSync(tmp, { recursive: true })
  for (const f of out.outputFiles) writeFileSync(join(tmp, relative(dir, f.path)), f.contents)
  try {
    renameSync(tmp, dir)
  } catch (err) {
    rmSync(tmp, { recursive: true, force: true })
    try {
      statSync(file)
    } catch {
      throw err
    }
  }
  pruneBundles(OUT_DIR, name, Date.now())
  return file
}

/** Bundles of one name kept whatever their age: the newest, and the few before it. */
const KEEP_NEWEST = 3
/** Older bundles are removed once this old: a process started from one may still load a chunk of it lazily. */
const KEEP_MS = 24 * 3600_000
/** A temporary folder this old was left by a process killed while it wrote. */
const TMP_MS = 3600_000

/**
 * Removes the bundles of `name` beyond the KEEP_NEWEST newest that are older than KEEP_MS, and
 * temporary folders left by killed builds: every edit of src/ makes a new bundle, and without this
 * they pile up. Best effort: a folder another process removes first, or cannot be removed, is left.
 * @param {string} outDir
 * @param {string} name
 * @param {number} nowMs
 */
export function pruneBundles(outDir, name, nowMs) {
  /** @type {{ path: string, mtimeMs: number, tmp: boolean }[]} */
  const found = []
  let entries
  try {
    entries = readdirSync(outDir, { withFileTypes: true })
  } catch {
    return
  }
  for (const e of entries) {
    const m = /^(.+)-[0-9a-f]{16}(\.\d+\.tmp)?$/.exec(e.name)
    if (!e.isDirectory() || !m || m[1] !== name) continue
    try {
      found.push({ path: join(outDir, e.name), mtimeMs: statSync(join(outDir, e.name)).mtimeMs, tmp: m[2] !== undefined })
    } catch {}
  }
  const bundles = found.filter((f) => !f.tmp).sort((a, b) => b.mtimeMs - a.mtimeMs)
  const doomed = [
    ...bundles.slice(KEEP_NEWEST).filter((f) => nowMs - f.mtimeMs > KEEP_MS),
    ...found.filter((f) => f.tmp && nowMs - f.mtimeMs > TMP_MS),
  ]
  for (const f of doomed) rmSync(f.path, { recursive: true, force: true })
}

/**
 * A hash of every file under `dirs` (names and contents), and of this file: a change anywhere makes
 * a new bundle.
 * @param {string[]} dirs
 */
function sourceHash(dirs) {
  const hash = createHash('sha256')
  /** @param {string} dir */
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const p = join(dir, e.name)
      if (e.isDirectory()) walk(p)
      else if (e.isFile()) hash.update(p).update('\0').update(readFileSync(p)).update('\0')
    }
  }
  for (const dir of dirs) walk(join(ROOT, dir))
  hash.update(readFileSync(fileURLToPath(import.meta.url)))
  return hash.digest('hex').slice(0, 16)
}
