/**
 * `npx hookq` in a checkout runs the checkout's CLI: npm links no project's own bin into
 * node_modules/.bin, so postinstall does (scripts/link-bin.mjs). Without the link, npm 10 (Node
 * 20's) looked for a package named hookq in the registry.
 */
import { spawnSync } from 'node:child_process'
import { mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'

const root = fileURLToPath(new URL('../..', import.meta.url))
const linkScript = join(root, 'scripts', 'link-bin.mjs')

t.test('the link script links a package’s own bins, relative, and again over an old link', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'hookq-bin-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'demo', bin: { demo: 'cli/demo.mjs' } }))
  mkdirSync(join(dir, 'cli'))
  writeFileSync(join(dir, 'cli', 'demo.mjs'), "#!/usr/bin/env node\nconsole.log('the local bin ran')\n", { mode: 0o755 })
  for (let i = 0; i < 2; i++) {
    const run = spawnSync(process.execPath, [linkScript, dir], { encoding: 'utf8' })
    t.equal(run.status, 0, run.stderr)
  }
  t.equal(realpathSync(join(dir, 'node_modules', '.bin', 'demo')), realpathSync(join(dir, 'cli', 'demo.mjs')))
  const ran = spawnSync(join(dir, 'node_modules', '.bin', 'demo'), { encoding: 'utf8' })
  t.equal(ran.stdout, 'the local bin ran\n')
})

t.test('in the checkout, the hookq bin is linked where npm exec looks for local bins', async (t) => {
  t.equal(
    realpathSync(join(root, 'node_modules', '.bin', 'hookq')),
    realpathSync(join(root, 'src', 'cli', 'hookq.mjs')),
    'linked by postinstall',
  )
  const run = spawnSync(join(root, 'node_modules', '.bin', 'hookq'), ['--version'], { cwd: root, encoding: 'utf8', timeout: 120_000 })
  t.equal(run.status, 0, run.stderr)
  t.equal(run.stdout.trim(), JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).version)
})
