// The broker as `npm start` runs it: src/server.ts and everything it imports from src/, bundled by
// esbuild (the compiler tsx itself runs on) into one ES module with a source map; packages stay
// external and load from node_modules. Plain JavaScript: the launcher (scripts/start.mjs) uses it
// before any TypeScript loader is there, and the process tests (test/helpers/process.ts) use it too.
//
// Why a bundle and not `node --import tsx src/server.ts`:
// - tsx compiles with esbuild's keepNames, which wraps every function and class made at run time in
//   a call that sets its name: on the push path, closures made per push paid for it (bench:ab, drain,
//   10 rounds of 40,000 messages: the broker 7.6% dearer per message under tsx than bundled).
// - Start-up: tsx resolves, reads and compiles each of ~150 files through loader hooks answering
//   from a thread of their own; spawn to listening took 3.3 s under tsx and 1.8 s bundled.
//
// The bundle is built once for each state of src/ (named by a hash of its files, so an edit makes a
// new one) under node_modules/.cache/hookq, inside the project so its bare imports resolve to the
// project's node_modules. It is written under a temporary name and renamed: processes building it
// at once (cluster workers, test files) never see a half-written file. The source's
// `import.meta.url` is replaced file by file with that file's own URL, so what a file finds next to
// itself (prisma/migrations, the console's files, package.json) it finds where it did.
import { createHash } from 'node:crypto'
import { mkdirSync, readdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const ROOT = fileURLToPath(new URL('../', import.meta.url))
const OUT_DIR = join(ROOT, 'node_modules/.cache/hookq')

/** The path of the bundle of src/ as it is now, built first if no process has built it yet. */
export async function serverBundle() {
  const file = join(OUT_DIR, `server-${sourceHash()}.mjs`)
  try {
    statSync(file)
    return file
  } catch {}
  const { build } = await import('esbuild')
  const out = await build({
    entryPoints: [join(ROOT, 'src/server.ts')],
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node20',
    packages: 'external',
    outfile: file,
    sourcemap: 'linked',
    write: false,
    logLevel: 'silent',
    plugins: [
      {
        name: 'own-import-meta-url',
        setup(b) {
          b.onLoad({ filter: /\.ts$/ }, (args) => ({
            contents: readFileSync(args.path, 'utf8').replaceAll('import.meta.url', JSON.stringify(pathToFileURL(args.path).href)),
            loader: 'ts',
          }))
        },
      },
    ],
  })
  mkdirSync(OUT_DIR, { recursive: true })
  // The map first: a process that finds the bundle finds its map too.
  const files = out.outputFiles
  for (const f of [...files.filter((f) => f.path.endsWith('.map')), ...files.filter((f) => !f.path.endsWith('.map'))]) {
    const tmp = `${f.path}.${process.pid}.tmp`
    writeFileSync(tmp, f.contents)
    renameSync(tmp, f.path)
  }
  return file
}

/** A hash of every file under src/ (names and contents): a change anywhere makes a new bundle. */
function sourceHash() {
  const hash = createHash('sha256')
  /** @param {string} dir */
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const p = join(dir, e.name)
      if (e.isDirectory()) walk(p)
      else if (e.isFile()) hash.update(p).update('\0').update(readFileSync(p)).update('\0')
    }
  }
  walk(join(ROOT, 'src'))
  return hash.digest('hex').slice(0, 16)
}
