// `npm start`: the broker from the bundle of src/ (scripts/server-bundle.mjs says why), built on the
// first start after a change to src/ (about a second) and reused after that. Where it cannot be
// built or written (no esbuild, a read-only node_modules), the broker runs from the source through
// tsx as before, and says so. Cluster workers (HOOKQ_PROCESSES) start through here too and find
// the bundle their primary built.
import { pathToFileURL } from 'node:url'
import { serverBundle } from './server-bundle.mjs'

let bundle
try {
  bundle = await serverBundle()
} catch (err) {
  console.error(`hookq: running src/ through tsx, as the bundle could not be built: ${err instanceof Error ? err.message : err}`)
}
if (bundle) {
  await import(pathToFileURL(bundle).href)
} else {
  const { register } = await import('tsx/esm/api')
  register()
  await import('../src/server.ts')
}
