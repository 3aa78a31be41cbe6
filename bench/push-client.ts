/**
 * The push client alone (src/dispatch/http-client.ts), `npm run bench:push-client`: CPU per request
 * of the process that sends, beside undici's dispatch() on the same sink in the same run.
 *
 * Why apart from bench:e2e: a change of a microsecond or two per push is lost in a whole broker's
 * figures, which vary by a third between runs of the same code on these machines (docs/performance.md,
 * "The push client's own cost"). Here one process sends and does nothing else, and its CPU comes
 * from process.cpuUsage() over exactly the measured requests.
 *
 * The sink is node:http in a child process on 127.0.0.1, answering `ok` once a request's body has
 * arrived. The body is push-shaped (about 500 bytes of JSON). Each client makes BENCH_REQUESTS
 * requests after BENCH_WARMUP of warm-up, BENCH_CONCURRENCY at a time on as many keep-alive
 * connections, BENCH_ROUNDS times in turn; every loop is bounded by its count and each request by
 * a 10 s deadline.
 *
 * Environment (all optional): BENCH_REQUESTS=60000 BENCH_WARMUP=10000 BENCH_CONCURRENCY=64 BENCH_ROUNDS=3
 */
import { fork } from 'node:child_process'
import type { AddressInfo } from 'node:net'
import { Pool } from 'undici'
import { HttpClient, type Origin } from '../src/dispatch/http-client.ts'
import { envInt } from './lib/env.ts'

if (process.argv[2] === 'sink') {
  const http = await import('node:http')
  const server = http.createServer((req, res) => {
    req.resume()
    req.on('end', () => res.end('ok'))
  })
  server.keepAliveTimeout = 60_000
  server.listen(0, '127.0.0.1', () => process.send!((server.address() as AddressInfo).port))
  process.on('disconnect', () => process.exit(0))
} else {
  await main()
}

async function main(): Promise<void> {
  const REQUESTS = envInt('BENCH_REQUESTS', 60_000)
  const WARMUP = envInt('BENCH_WARMUP', 10_000)
  const CONCURRENCY = envInt('BENCH_CONCURRENCY', 64)
  const ROUNDS = envInt('BENCH_ROUNDS', 3)
  const sink = fork(new URL(import.meta.url).pathname, ['sink'], { execArgv: ['--import', 'tsx'], stdio: 'inherit' })
  try {
    const port = await new Promise<number>((resolve, reject) => {
      sink.once('message', (p) => resolve(p as number))
      sink.once('exit', (code) => reject(new Error(`the sink exited (${code}) before listening`)))
    })
    const body = JSON.stringify({
      deliveryId: 'AAAAAQAAAAAAAAAAAAAAAAAAAAEAAAAB1b2Yk7Ih3VYz1dCt0aT7Yw',
      topic: 'bench',
      group: 'bench',
      partition: 0,
      offset: 0,
      key: null,
      value: { v: 'x'.repeat(250) },
      headers: {},
      attempt: 1,
      timestamp: new Date().toISOString(),
      ackDeadline: new Date().toISOString(),
    })
    const headerLines = 'content-type: application/json\r\nuser-agent: hookq\r\nhookq-attempt: 1\r\n'
    console.log(
      `push client bench: ${REQUESTS.toLocaleString('en-US')} requests (after ${WARMUP.toLocaleString('en-US')} of warm-up), ${CONCURRENCY} at a time, ${Buffer.byteLength(body)}-byte bodies, sink pid ${sink.pid} at 127.0.0.1:${port}`,
    )

    const clients = {
      'hookq http-client': () => hookqClient(port, body, headerLines, CONCURRENCY),
      'undici dispatch()': () => undiciClient(port, body, CONCURRENCY),
    }
    const results = new Map<string, number[]>()
    for (let round = 1; round <= ROUNDS; round++) {
      for (const [name, make] of Object.entries(clients)) {
        const c = make()
        try {
          await run(c.send, WARMUP, CONCURRENCY)
          const cpu = process.cpuUsage()
          const t0 = performance.now()
          await run(c.send, REQUESTS, CONCURRENCY)
          const used = process.cpuUsage(cpu)
          const seconds = (performance.now() - t0) / 1000
          const us = (used.user + used.system) / REQUESTS
          results.set(name, [...(results.get(name) ?? []), us])
          console.log(
            `round ${round}  ${name.padEnd(18)} ${us.toFixed(1).padStart(6)} us CPU per request (user ${(used.user / REQUESTS).toFixed(1)}, system ${(used.system / REQUESTS).toFixed(1)}), ${Math.round(REQUESTS / seconds).toLocaleString('en-US')} requests/s`,
          )
        } finally {
          await c.close()
        }
      }
    }
    console.log('\nmedians (CPU of the sending process per request):')
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
    const base = median(results.get('undici dispatch()')!)
    for (const [name, xs] of results)
      console.log(`  ${name.padEnd(18)} ${median(xs).toFixed(1).padStart(6)} us   ${(median(xs) / base).toFixed(2)}x undici dispatch()`)
  } finally {
    sink.disconnect()
  }
}

interface BenchClient {
  send(): Promise<void>
  close(): Promise<void>
}

/** `count` requests through `send`, `concurrency` loops at once; throws on the first failure. */
async function run(send: () => Promise<void>, count: number, concurrency: number): Promise<void> {
  let started = 0
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (started < count) {
        started++
        await send()
      }
    }),
  )
}

function hookqClient(port: number, body: string, headerLines: string, connections: number): BenchClient {
  const origin: Origin = { key: `http://127.0.0.1:${port}`, tls: false, hostname: '127.0.0.1', port, host: `127.0.0.1:${port}` }
  const client = new HttpClient({ connections })
  return {
    send: () =>
      new Promise((resolve, reject) =>
        client.request(origin, {
          path: '/p',
          headerLines,
          body,
          timeoutMs: 10_000,
          maxBodyBytes: 4096,
          done: (o) => (o.kind === 'answer' && o.status === 200 ? resolve() : reject(new Error(`push failed: ${JSON.stringify(o)}`))),
        }),
      ),
    close: () => client.close(),
  }
}

function undiciClient(port: number, body: string, connections: number): BenchClient {
  // A keep-alive pool of as many connections, one request on each at a time (as the push client).
  const client = new Pool(`http://127.0.0.1:${port}`, { connections, pipelining: 1 })
  const headers = { 'content-type': 'application/json', 'user-agent': 'hookq', 'hookq-attempt': '1' }
  const send = () =>
    new Promise<void>((resolve, reject) => {
      let status = 0
      // The handler interface undici's core Request takes as is (as bench/e2e-load.ts's ceiling does).
      const handler = {
        onConnect() {},
        onError: reject,
        onHeaders(statusCode: number) {
          status = statusCode
          return true
        },
        onData: () => true,
        onComplete: () => (status === 200 ? resolve() : reject(new Error(`HTTP ${status}`))),
      } as unknown as Parameters<Pool['dispatch']>[1]
      client.dispatch(
        { origin: `http://127.0.0.1:${port}`, path: '/p', method: 'POST', headers, body, headersTimeout: 10_000, bodyTimeout: 10_000 },
        handler,
      )
    })
  return { send, close: () => client.close() }
}
