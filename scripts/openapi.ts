/**
 * Writes (`write`) or verifies (`check`) openapi/openapi.json, the OpenAPI document built by
 * @fastify/swagger from the route schemas. No database is needed: routes are registered, never called.
 */
import { readFile, writeFile, mkdir } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { buildApp } from '../src/app.ts'
import type { Services } from '../src/service/services.ts'

const file = fileURLToPath(new URL('../openapi/openapi.json', import.meta.url))
const mode = process.argv[2]
if (mode !== 'write' && mode !== 'check') {
  console.error('usage: openapi.ts write|check')
  process.exit(2)
}

const unused = new Proxy(
  {},
  {
    get: () => {
      throw new Error('services are not available while generating OpenAPI')
    },
  },
)
const app = await buildApp({ services: unused as Services, maxRequestBytes: 1024 })
await app.ready()
const text = `${JSON.stringify(app.swagger(), null, 2)}\n`
await app.close()

if (mode === 'write') {
  await mkdir(fileURLToPath(new URL('../openapi/', import.meta.url)), { recursive: true })
  await writeFile(file, text)
  console.log(`wrote ${file}`)
} else {
  const current = await readFile(file, 'utf8').catch(() => '')
  if (current !== text) {
    console.error('openapi/openapi.json is stale: the routes changed. Run `npm run openapi:gen` and commit the result.')
    process.exit(1)
  }
  console.log('openapi/openapi.json is current')
}
