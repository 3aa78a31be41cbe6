/** The console's static routes against path traversal and files that are not the console's: never served, never a 5xx. */
import t from '../helpers/tap.ts'
import net from 'node:net'
import { startListeningBroker } from '../helpers/broker.ts'

const { url } = await startListeningBroker(t)
const port = Number(new URL(url).port)

/** A raw GET, so no client normalises the path. Status line and CSP header. */
function rawGet(path: string): Promise<{ status: number; csp: boolean; body: string }> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => s.write(`GET ${path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n`))
    let data = ''
    s.on('data', (d) => {
      data += d
    })
    s.on('end', () =>
      resolve({
        status: Number(data.split(' ')[1]),
        csp: /content-security-policy/i.test(data.split('\r\n\r\n')[0] ?? ''),
        body: data.split('\r\n\r\n').slice(1).join(''),
      }),
    )
    s.on('error', reject)
  })
}

t.test('paths', async (t) => {
  for (const p of [
    '/console/../package.json',
    '/console/%2e%2e/%2e%2e/package.json',
    '/console/..%2f..%2fpackage.json',
    '/console/..%2fhttp%2froutes%2fconsole.ts',
    '/console/vendor/..%2f..%2f..%2fpackage.json',
    '/console/tsconfig.json',
    '/console/vendor/uPlot.esm.d.ts',
    '/console/..%2f..%2fnode_modules%2fuplot%2fpackage.json',
    '/console/vendor/..%2fuPlot.cjs.js',
    '/console/%2e%2e%2f%2e%2e%2fserver.js',
    '/console/..%5c..%5cpackage.json',
    '/console/vendor/%2e%2e/uPlot.iife.js',
  ]) {
    const r = await rawGet(p)
    t.comment(`${p} -> ${r.status} ${r.body.slice(0, 200).replace(/\s+/g, ' ')}`)
    t.ok(r.status === 404 || r.status === 400, `${p} is not served: ${r.status}`)
    t.notMatch(r.body, /"dependencies"|compilerOptions|import \{|export /, `${p}: no file content`)
  }
  const idx = await rawGet('/console/')
  t.equal(idx.status, 200)
  t.ok(idx.csp, 'index has CSP')
})
