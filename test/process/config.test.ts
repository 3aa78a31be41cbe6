import t from '../helpers/tap.ts'
import net from 'node:net'
import { mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { loadConfig, ConfigError } from '../../src/config.ts'
import { runBrokerToExit } from '../helpers/process.ts'

t.test('defaults', async (t) => {
  const c = loadConfig({})
  t.match(c, {
    host: '127.0.0.1',
    port: 8080,
    databaseUrl: undefined,
    dataDir: './data',
    maxMessageBytes: 1048576,
    maxRequestBytes: 10485760,
    apiKeys: [],
    pushWindowInitial: 8,
    pushWindowMax: 1000,
    logRequests: false,
    retentionIntervalMs: 60_000,
    attemptRetentionMs: 7 * 86_400_000,
    lingerCpuPercent: 90,
  })
  t.equal(loadConfig({ HOOKQ_LINGER_CPU_PERCENT: '0' }).lingerCpuPercent, 0, '0: always wait after a full statement')
  t.equal(loadConfig({ HOOKQ_ATTEMPT_RETENTION_MS: '60000' }).attemptRetentionMs, 60_000, 'one minute, the least')
  t.equal(loadConfig({ HOOKQ_LOG_REQUESTS: 'yes' }).logRequests, true)
  t.equal(loadConfig({ HOOKQ_ADVERTISE_URL: 'http://10.0.0.5:8080/' }).advertiseUrl, 'http://10.0.0.5:8080')
  t.match(loadConfig({}), { advertiseUrl: undefined, clusterPollMs: 1000 })
  t.match(loadConfig({ HOOKQ_LEADER_POLL_MS: '300' }), { clusterPollMs: 300 }, 'the old name still works')
  t.match(loadConfig({}), { requestTimeoutMs: 30_000, headersTimeoutMs: 10_000, keepAliveTimeoutMs: 5000 })
  t.match(
    loadConfig({ HOOKQ_REQUEST_TIMEOUT_MS: '2000' }),
    { requestTimeoutMs: 2000, headersTimeoutMs: 2000 },
    'headers default to at most the request timeout',
  )
})

t.test('bad values are refused with the variable named', async (t) => {
  const bad: [Record<string, string>, RegExp][] = [
    [{ PORT: 'eighty' }, /PORT must be a whole number from 0 to 65535, got "eighty"/],
    [{ PORT: '70000' }, /PORT must be a whole number/],
    [{ DATABASE_URL: 'mysql://x' }, /DATABASE_URL must be a postgresql:\/\/ URL/],
    [{ LOG_LEVEL: 'loud' }, /LOG_LEVEL must be one of/],
    [{ HOOKQ_MAX_MESSAGE_BYTES: '2000000', HOOKQ_MAX_REQUEST_BYTES: '1000000' }, /must not exceed HOOKQ_MAX_REQUEST_BYTES/],
    [{ HOOKQ_DB_POOL_SIZE: '0' }, /HOOKQ_DB_POOL_SIZE/],
    [{ HOOKQ_LINGER_CPU_PERCENT: '101' }, /HOOKQ_LINGER_CPU_PERCENT must be a whole number from 0 to 100, got 101/],
    [{ DATABASE_URL: 'postgresql://u@h/db?schema=hq' }, /DATABASE_URL names schema "hq": hookq keeps its tables in the public schema/],
    [{ HOOKQ_ADVERTISE_URL: 'ftp://x' }, /HOOKQ_ADVERTISE_URL must be an http:\/\/ or https:\/\/ base URL/],
    [{ HOOKQ_ADVERTISE_URL: 'http://10.0.0.5:8080/hookq' }, /HOOKQ_ADVERTISE_URL must be/],
    [{ HOOKQ_CLUSTER_POLL_MS: '10' }, /HOOKQ_CLUSTER_POLL_MS must be a whole number from 50/],
    [{ HOOKQ_LOG_REQUESTS: 'sometimes' }, /HOOKQ_LOG_REQUESTS must be true or false, got "sometimes"/],
    [{ HOOKQ_PUSH_WINDOW_MAX: '0' }, /HOOKQ_PUSH_WINDOW_MAX must be a whole number from 1/],
    [{ HOOKQ_PUSH_ALLOW_PRIVATE: 'maybe' }, /HOOKQ_PUSH_ALLOW_PRIVATE must be true or false/],
    [{ HOOKQ_REQUEST_TIMEOUT_MS: '0' }, /HOOKQ_REQUEST_TIMEOUT_MS must be a whole number from 100 to 3600000, got 0/],
    [{ HOOKQ_HEADERS_TIMEOUT_MS: '10s' }, /HOOKQ_HEADERS_TIMEOUT_MS must be a whole number from 100/],
    [{ HOOKQ_KEEP_ALIVE_TIMEOUT_MS: '-1' }, /HOOKQ_KEEP_ALIVE_TIMEOUT_MS must be a whole number from 100/],
    [{ HOOKQ_ATTEMPT_RETENTION_MS: '59999' }, /HOOKQ_ATTEMPT_RETENTION_MS must be a whole number from 60000 to 315360000000, got 59999/],
    [{ HOOKQ_ATTEMPT_RETENTION_MS: '7d' }, /HOOKQ_ATTEMPT_RETENTION_MS must be a whole number from 60000/],
    [
      { HOOKQ_REQUEST_TIMEOUT_MS: '1000', HOOKQ_HEADERS_TIMEOUT_MS: '2000' },
      /HOOKQ_HEADERS_TIMEOUT_MS \(2000\) must not exceed HOOKQ_REQUEST_TIMEOUT_MS \(1000\)/,
    ],
  ]
  for (const [env, message] of bad) t.throws(() => loadConfig(env), { name: 'ConfigError', message }, JSON.stringify(env))
  t.ok(new ConfigError('x') instanceof Error)
  t.same(loadConfig({ HOOKQ_API_KEYS: ' a, b ,,' }).apiKeys, [
    { key: 'a', scopes: ['admin'] },
    { key: 'b', scopes: ['admin'] },
  ])
})

t.test('the broker refuses to start on a bad value, saying why, with exit code 2', async (t) => {
  const { code, output } = await runBrokerToExit({ PORT: 'eighty' })
  t.equal(code, 2)
  t.match(output, /hookq: configuration error: PORT must be a whole number from 0 to 65535, got "eighty"/)
  const timeout = await runBrokerToExit({ HOOKQ_KEEP_ALIVE_TIMEOUT_MS: 'forever' })
  t.equal(timeout.code, 2)
  t.match(timeout.output, /hookq: configuration error: HOOKQ_KEEP_ALIVE_TIMEOUT_MS must be a whole number/)
  const retention = await runBrokerToExit({ HOOKQ_ATTEMPT_RETENTION_MS: '1000' })
  t.equal(retention.code, 2)
  t.match(
    retention.output,
    /hookq: configuration error: HOOKQ_ATTEMPT_RETENTION_MS must be a whole number from 60000 to 315360000000, got 1000/,
  )
})

t.test('start-up failures say why in one line, with exit code 1', async (t) => {
  const dir = await mkdtemp(path.join(tmpdir(), 'hookq-startup-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const oneLine = (output: string, reason: RegExp) => {
    t.equal(output.match(/^hookq: cannot start: /gm)?.length, 1, 'one line says it')
    t.match(output, reason)
    t.notMatch(output, /"stack"|\n\s+at /, 'no stack trace')
  }

  // The data directory held by a live process (this one: its pid is in the lock file).
  const held = path.join(dir, 'held')
  await mkdir(held)
  await writeFile(path.join(held, 'hookq.lock'), `${process.pid}\n`)
  const inUse = await runBrokerToExit({ HOOKQ_DATA_DIR: held, HOST: '127.0.0.1', PORT: '0' })
  t.equal(inUse.code, 1, 'data directory in use: exit 1')
  oneLine(inUse.output, new RegExp(`^hookq: cannot start: the data directory ${held} is in use by process ${process.pid}$`, 'm'))

  // The next two are said before the database is made and migrated (seconds on a first start):
  // the embedded data directory they name is never created.
  const notMade = async (name: string) => t.rejects(stat(path.join(dir, name)), { code: 'ENOENT' }, `no ${name} database made`)

  // A port another process listens on.
  const taken = net.createServer()
  await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r))
  t.teardown(() => taken.close())
  const port = (taken.address() as net.AddressInfo).port
  const busy = await runBrokerToExit({ HOOKQ_DATA_DIR: path.join(dir, 'busy'), HOST: '127.0.0.1', PORT: String(port) })
  t.equal(busy.code, 1, 'port in use: exit 1')
  oneLine(busy.output, new RegExp(`^hookq: cannot start: 127\\.0\\.0\\.1:${port} is in use by another process \\(EADDRINUSE\\)`, 'm'))
  await notMade('busy')

  // A HOST that does not resolve (.invalid never does, RFC 6761); a port, as 0 asks for none.
  const nowhere = await runBrokerToExit({ HOOKQ_DATA_DIR: path.join(dir, 'nowhere'), HOST: 'hookq.invalid', PORT: '8080' })
  t.equal(nowhere.code, 1, 'HOST unresolvable: exit 1')
  oneLine(nowhere.output, /^hookq: cannot start: HOST hookq\.invalid does not resolve \((ENOTFOUND|EAI_AGAIN)\)/m)
  await notMade('nowhere')

  // PostgreSQL not answering: a loopback port nothing listens on (taken, then freed).
  const gone = net.createServer()
  await new Promise<void>((r) => gone.listen(0, '127.0.0.1', r))
  const gonePort = (gone.address() as net.AddressInfo).port
  await new Promise<void>((r) => gone.close(() => r()))
  const noDb = await runBrokerToExit({ DATABASE_URL: `postgresql://postgres@127.0.0.1:${gonePort}/x`, HOST: '127.0.0.1', PORT: '0' })
  t.equal(noDb.code, 1, 'no PostgreSQL: exit 1')
  oneLine(
    noDb.output,
    new RegExp(`^hookq: cannot start: PostgreSQL does not answer at 127\\.0\\.0\\.1:${gonePort} \\(ECONNREFUSED\\)`, 'm'),
  )
})
