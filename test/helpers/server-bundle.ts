/**
 * The broker as process tests start it: src/server.ts and everything it imports from src/, bundled
 * by esbuild (the compiler tsx itself runs on) into one ES module; packages stay external and load
 * from node_modules as they do under `npm start`.
 *
 * Why: under `node --import tsx` every one of the ~150 source files is resolved, read and compiled
 * through the loader's hooks, which answer from a thread of their own, one message at a time. That
 * was about half of a broker's start here (3.3 s from spawn to listening under tsx, 1.8 s bundled; December 2026), and the process tests
 * start over a hundred brokers. The bundle is the same source through the same compiler, built once
 * for each state of src/ and shared by every test process: its name is a hash of src/'s files, and
 * it is written under a temporary name and renamed, so processes building it at once do not see a
 * half-written file.
 *
 * The source's `import.meta.url` is replaced, file by file, with that file's own URL: what it finds
 * next to itself (prisma/migrations, the console's files, package.json) it finds where it did.
 */
import { createHash } from 'node:crypto'
import { mkdirSync, readdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'
import { build } from 'esbuild'

const root = fileURLToPath(new URL('../../', import.meta.url))
// Inside the project, so that the bundle's bare imports resolve to the project's node_modules.
const OUT_DIR = join(root, 'node_modules/.cache/hookq-test')

let entry: Promise<string> | undefined

/** The path of the bundled broker for src/ as it is now, built if no test process has yet. */
export function serverBundle(): Promise<string> {
  entry ??= buildOnce()
  return entry
}

async function buildOnce(): Promise<string> {
  const file = join(OUT_DIR, `server-${sourceHash()}.mjs`)
  try {
    statSync(file)
    return file
  } catch {}
  const out = await build({
    entryPoints: [join(root, 'src/server.ts')],
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
function sourceHash(): string {
  const hash = createHash('sha256')
  const walk = (dir: string) => {
    for (const e of readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const p = join(dir, e.name)
      if (e.isDirectory()) walk(p)
      else if (e.isFile()) hash.update(p).update('\0').update(readFileSync(p)).update('\0')
    }
  }
  walk(join(root, 'src'))
  return hash.digest('hex').slice(0, 16)
}
