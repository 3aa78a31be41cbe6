// The load hook of scripts/ts-loader.mjs (it runs on Node's loader thread): a .ts file is compiled by
// esbuild's transform, as tsx does it, and kept in node_modules/.cache/hookq/ts under a hash of its
// path and contents, so a test process reads what an earlier one compiled. Everything else goes to
// Node's own loader untouched: no resolve hook (every import names its file, `.ts` included:
// tsconfig's allowImportingTsExtensions), no CommonJS hook, no tsconfig lookups per module.
import { createHash } from 'node:crypto'
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const require = createRequire(import.meta.url)
export const CACHE_DIR = fileURLToPath(new URL('../node_modules/.cache/hookq/ts', import.meta.url))

// tsconfig.json's options that change what a file compiles to: with verbatimModuleSyntax a type is
// imported as one (`import type`), so a file compiles alone, without the files it imports.
const OPTIONS = {
  loader: 'ts',
  format: 'esm',
  target: 'node20',
  sourcemap: 'inline',
  tsconfigRaw: { compilerOptions: { verbatimModuleSyntax: true, target: 'ES2023' } },
}
/** esbuild, loaded at the first file not in the cache (most processes never need it). */
let esbuild
let salt

/** @type {import('node:module').LoadHook} */
export async function load(url, context, nextLoad) {
  if (!url.startsWith('file:') || !url.endsWith('.ts')) return nextLoad(url, context)
  const path = fileURLToPath(url)
  const source = readFileSync(path, 'utf8')
  salt ??= JSON.stringify(OPTIONS) + require('esbuild/package.json').version
  const key = createHash('sha256').update(salt).update(path).update('\0').update(source).digest('hex').slice(0, 32)
  const file = join(CACHE_DIR, `${key}.mjs`)
  let code
  try {
    code = readFileSync(file, 'utf8')
  } catch {
    esbuild ??= require('esbuild')
    code = esbuild.transformSync(source, { ...OPTIONS, sourcefile: path }).code
    // Written whole, then renamed: test processes compiling the same file at once never read half of one.
    const tmp = `${file}.${process.pid}.tmp`
    mkdirSync(CACHE_DIR, { recursive: true })
    writeFileSync(tmp, code)
    renameSync(tmp, file)
  }
  return { format: 'module', source: code, shortCircuit: true }
}
