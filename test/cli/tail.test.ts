/**
 * `hookq tail` without --follow reads only what it prints: `--limit n` alone prints the newest n,
 * `--from X --limit n` the n from X, and the partition reads ask for no more than that (a front
 * on 127.0.0.1 records them on their way to the real broker). Reads wait out a 503 like every
 * other call.
 */
import type { Test } from 'tap'
import t from '../helpers/tap.ts'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { createClient, produceInBatches, unwrap } from '@hookq/client'
import { startListeningBroker } from '../helpers/broker.ts'
import { runCli } from './run.ts'

const { url } = await startListeningBroker(t)
const hookq = createClient({ baseUrl: url, apiKey: '' })
// The tests run side by side on the one broker, each on topics (and a front) of its own: most of
// their time is CLI processes starting, which need not wait for another test's.
t.jobs = 4
const createTopic = (topic: string, partitions: number) =>
  unwrap(hookq.PUT('/v1/topics/{topic}', { params: { path: { topic } }, body: { partitions } }))

/** A partition read as the front saw it. */
interface Read {
  partition: number
  fromOffset: number
  limit: number
}

/** A front to the broker that records partition reads and sheds (503, Retry-After 0) the first `shedReads` of them. */
async function startFront(t: Test, shedReads = 0): Promise<{ url: string; reads: Read[] }> {
  const reads: Read[] = []
  let shed = 0
  const front = http.createServer((req, res) => {
    req.resume()
    req.on('end', async () => {
      const target = new URL(req.url ?? '/', url)
      const read = /\/partitions\/(\d+)\/messages$/.exec(target.pathname)
      if (read !== null) {
        if (shed < shedReads) {
          shed++
          res.writeHead(503, { 'content-type': 'application/problem+json', 'retry-after': '0' })
          res.end(
            JSON.stringify({
              type: 'about:blank',
              title: 'The broker is overloaded',
              status: 503,
              code: 'overloaded',
              detail: 'shed by the test front',
            }),
          )
          return
        }
        reads.push({
          partition: Number(read[1]),
          fromOffset: Number(target.searchParams.get('fromOffset')),
          limit: Number(target.searchParams.get('limit')),
        })
      }
      const answer = await fetch(target, { method: req.method })
      res.writeHead(answer.status, { 'content-type': answer.headers.get('content-type') ?? 'application/json' }).end(await answer.text())
    })
  })
  await new Promise<void>((resolve) => front.listen(0, '127.0.0.1', resolve))
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        front.closeAllConnections()
        front.close(() => resolve())
      }),
  )
  return { url: `http://127.0.0.1:${(front.address() as AddressInfo).port}`, reads }
}

/** `partition:offset` of each printed line. */
const coordinates = (stdout: string): string[] =>
  stdout
    .trim()
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.split(' ')[0]!)

t.test('one partition of 3000 messages: the newest 5, and 3 from offset 10, reading only those', async (t) => {
  await createTopic('long', 1)
  const results = await produceInBatches(
    hookq,
    'long',
    Array.from({ length: 3000 }, (_, i) => ({ value: { i } })),
  )
  t.equal(results.length, 3000)

  const front = await startFront(t)
  const newest = await runCli(['tail', 'long', '--limit', '5'], { url: front.url })
  t.equal(newest.code, 0, newest.stderr)
  t.same(coordinates(newest.stdout), ['0:2995', '0:2996', '0:2997', '0:2998', '0:2999'], 'exactly the newest 5, oldest first')
  t.match(newest.stdout.split('\n')[4], /^0:2999 \S+ key=- \{"i":2999\}$/)
  t.same(front.reads, [{ partition: 0, fromOffset: 2995, limit: 5 }], 'one read of the 5 printed')

  front.reads.length = 0
  const from = await runCli(['--json', 'tail', 'long', '--from', '10', '--limit', '3'], { url: front.url })
  t.equal(from.code, 0, from.stderr)
  t.same(
    from.stdout
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as { offset: number }).offset),
    [10, 11, 12],
    '--from is the first offset, --limit stops after 3',
  )
  t.same(front.reads, [{ partition: 0, fromOffset: 10, limit: 3 }], 'one read of the 3 printed')

  front.reads.length = 0
  const last = await runCli(['tail', 'long', '-n', '4', '--limit', '2'], { url: front.url })
  t.equal(last.code, 0, last.stderr)
  t.same(coordinates(last.stdout), ['0:2996', '0:2997'], '-n says where to start, --limit stops after 2')
  t.ok(front.reads.length > 0 && front.reads.every((r) => r.fromOffset >= 2996 && r.limit <= 2), 'nothing before the start is read')

  front.reads.length = 0
  const all = await runCli(['tail', 'long', '--from', '1500'], { url: front.url })
  t.equal(all.code, 0, all.stderr)
  const printed = coordinates(all.stdout)
  t.equal(printed.length, 1500, 'without --limit, up to the end')
  t.equal(printed[0], '0:1500')
  t.equal(printed.at(-1), '0:2999')
  t.ok(front.reads.length >= 2 && front.reads.every((r) => r.limit <= 1000), 'a page at a time')
})

t.test('two partitions: the newest n of the topic in time order, and --limit across partitions', async (t) => {
  await createTopic('pair', 2)
  // One call each, alternating partitions, so the time order is 0:0 1:0 0:1 1:1 0:2 1:2.
  for (let i = 0; i < 6; i++) {
    await unwrap(
      hookq.POST('/v1/topics/{topic}/messages', {
        params: { path: { topic: 'pair' } },
        body: { messages: [{ value: i, partition: i % 2 }] },
      }),
    )
  }
  const newest = await runCli(['tail', 'pair', '--limit', '3'], { url })
  t.equal(newest.code, 0, newest.stderr)
  t.same(coordinates(newest.stdout), ['1:1', '0:2', '1:2'], 'the three newest of both partitions, in time order')

  const from = await runCli(['tail', 'pair', '--from', '1', '--limit', '3'], { url })
  t.equal(from.code, 0, from.stderr)
  t.same(coordinates(from.stdout), ['0:1', '1:1', '0:2'], 'the three oldest from offset 1 of each partition, in time order')

  const plain = await runCli(['tail', 'pair'], { url })
  t.same(coordinates(plain.stdout).sort(), ['0:0', '0:1', '0:2', '1:0', '1:1', '1:2'], 'without --limit: the last 10 of each partition')

  const one = await runCli(['tail', 'pair', '-p', '1', '--limit', '2'], { url })
  t.same(coordinates(one.stdout), ['1:1', '1:2'], "--partition with --limit: that partition's newest 2")
})

t.test('a partition read answered 503 is waited out, as every other call is', async (t) => {
  await createTopic('busy', 1)
  await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', {
      params: { path: { topic: 'busy' } },
      body: { messages: [{ value: 'a' }, { value: 'b' }] },
    }),
  )
  const front = await startFront(t, 2)
  const run = await runCli(['tail', 'busy'], { url: front.url })
  t.equal(run.code, 0, run.stderr)
  t.same(coordinates(run.stdout), ['0:0', '0:1'])
  t.equal(front.reads.length, 1, 'read once the two 503 answers were waited out')
})

t.test('keys, values and headers are shown with every control character escaped', async (t) => {
  await createTopic('controls', 1)
  const key = 'k\u001b[2J\u202egnp.exe\u009b31m\u200f'
  const value = { 'n\u0085': 'v\u009b\u202e\u2066\u007f\u001b' }
  const headers = { 'h\u202e': 'x\u0090y\u061c' }
  await unwrap(
    hookq.POST('/v1/topics/{topic}/messages', { params: { path: { topic: 'controls' } }, body: { messages: [{ key, value, headers }] } }),
  )
  // Everything a terminal would act on or reorder by: C0 but the line end, DEL, C1, bidi controls.
  // biome-ignore lint/suspicious/noControlCharactersInRegex: these are the characters it looks for
  const raw = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/
  const plain = await runCli(['tail', 'controls'], { url })
  t.equal(plain.code, 0, plain.stderr)
  t.notOk(raw.test(plain.stdout), 'no control character reaches the terminal')
  t.match(plain.stdout, 'key=k\\x1b[2J\\u202egnp.exe\\x9b31m\\u200f ')
  t.match(plain.stdout, '{"n\\u0085":"v\\u009b\\u202e\\u2066\\u007f\\u001b"} headers={"h\\u202e":"x\\u0090y\\u061c"}')

  const json = await runCli(['--json', 'tail', 'controls'], { url })
  t.equal(json.code, 0, json.stderr)
  t.notOk(raw.test(json.stdout), 'nor in --json')
  t.match(JSON.parse(json.stdout.trim()), { key, value, headers }, '--json still parses to the message as produced')
})
