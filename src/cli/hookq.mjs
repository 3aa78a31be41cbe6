#!/usr/bin/env node
// The `hookq` bin: runs the CLI (src/cli/main.ts) from its bundle (scripts/server-bundle.mjs says
// why), built on the first command after a change to src/ and reused after that, and exits with its
// code. Where the bundle cannot be built or written (no esbuild, a read-only node_modules), the CLI
// runs from the source through tsx, as `npm start` does then.
import { pathToFileURL } from 'node:url'
import { cliBundle } from '../../scripts/server-bundle.mjs'

let bundle
try {
  bundle = await cliBundle()
} catch {
  // Quietly: a command's output is the command's (scripts read it).
}
let main
if (bundle) {
  ;({ main } = await import(pathToFileURL(bundle).href))
} else {
  const { register } = await import('tsx/esm/api')
  register()
  ;({ main } = await import('./main.ts'))
}
process.exitCode = await main(process.argv)
