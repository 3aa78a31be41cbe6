/**
 * A request whose target names a host (absolute-form, `POST http://10.0.0.5/v1/...`) is refused
 * with 400: the router would take it, and a forwarded ack built from it would go to that host.
 */
import net from 'node:net'
import t from 'tap'
import { startListeningBroker } from '../helpers/broker.ts'

/** Sends one raw HTTP/1.1 request and returns the status line's code. */
function rawStatus(url: string, requestLine: string): Promise<number> {
  const { hostname, port } = new URL(url)
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), hostname, () => {
      const body = requestLine.startsWith('POST')
        ? { headers: 'content-type: application/json\r\ncontent-length: 2\r\n', text: '{}' }
        : { headers: '', text: '' }
      socket.write(`${requestLine}\r\nhost: ${hostname}:${port}\r\n${body.headers}connection: close\r\n\r\n${body.text}`)
    })
    let text = ''
    socket.on('data', (d) => {
      text += d.toString('latin1')
    })
    socket.on('end', () => resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0)))
    socket.on('error', reject)
  })
}

t.test('absolute-form request targets are refused; origin-form ones are served', async (t) => {
  const { url } = await startListeningBroker(t)
  t.equal(await rawStatus(url, 'POST http://127.0.0.1:9/v1/groups/g/acks HTTP/1.1'), 400, 'a target naming another host: 400')
  t.equal(await rawStatus(url, 'GET http://127.0.0.1:9/v1/topics HTTP/1.1'), 400, 'also for a GET')
  t.equal(await rawStatus(url, 'GET /v1/topics HTTP/1.1'), 200, 'a path is served')
})
