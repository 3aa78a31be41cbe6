// Links the package's own bins (package.json "bin": hookq) into node_modules/.bin of a checkout.
// npm links the bins of a project's dependencies there, never the project's own. Recent npm (10.2
// to 11 tried here) runs a project's own bin through an entry in its npx cache; where that step
// is missing or fails (an issue-29 tester saw `npx hookq` find no local bin), npm exec looks in
// node_modules/.bin and then goes to the registry for a package named hookq. The link makes the
// checkout's CLI the one found. Run by postinstall, and alone: `node scripts/link-bin.mjs [dir]`.
// Skipped where the package is itself installed as a dependency (npm links its bin then) and on
// Windows, where `npm run hookq -- ...` is the way.
import { lstatSync, mkdirSync, readFileSync, symlinkSync, unlinkSync } from 'node:fs'
import { join, relative, resolve, sep } from 'node:path'
import { fileURLToPath } from 'node:url'

export function linkBins(root) {
  if (process.platform === 'win32' || resolve(root).split(sep).includes('node_modules')) return []
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'))
  const bins = typeof pkg.bin === 'string' ? { [pkg.name]: pkg.bin } : (pkg.bin ?? {})
  const binDir = join(root, 'node_modules', '.bin')
  mkdirSync(binDir, { recursive: true })
  const linked = []
  for (const [name, target] of Object.entries(bins)) {
    const link = join(binDir, name)
    try {
      if (lstatSync(link, { throwIfNoEntry: false })) unlinkSync(link)
      symlinkSync(relative(binDir, join(root, target)), link)
      linked.push(name)
    } catch (err) {
      console.warn(`hookq: could not link node_modules/.bin/${name} (${err.message}); use npm run ${name} -- ...`)
    }
  }
  return linked
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  linkBins(process.argv[2] ?? fileURLToPath(new URL('..', import.meta.url)))
}
