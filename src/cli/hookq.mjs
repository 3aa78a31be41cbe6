#!/usr/bin/env node
// The `hookq` bin: loads the TypeScript CLI through tsx (as `npm start` runs the broker) and
// exits with its code. See src/cli/main.ts.
import { register } from 'tsx/esm/api'

register()
const { main } = await import('./main.ts')
process.exitCode = await main(process.argv)
