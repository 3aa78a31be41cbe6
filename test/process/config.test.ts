import t from 'tap'
import { loadConfig, ConfigError } from '../../src/config.ts'
import { runBrokerToExit } from '../helpers/process.ts'

t.test('defaults', async (t) => {
  const c = loadConfig({})
  t.match(c, { host: '127.0.0.1', port: 8080, databaseUrl: undefined, dataDir: './data', maxMessageBytes: 1048576, maxRequestBytes: 10485760, apiKeys: [], pushWindowInitial: 8, pushWindowMax: 1000, logRequests: false })
  t.equal(loadConfig({ HOOKQ_LOG_REQUESTS: 'yes' }).logRequests, true)
  t.equal(loadConfig({ HOOKQ_ADVERTISE_URL: 'http://10.0.0.5:8080/' }).advertiseUrl, 'http://10.0.0.5:8080')
  t.match(loadConfig({}), { advertiseUrl: undefined, leaderPollMs: 1000 })
  t.match(loadConfig({}), { requestTimeoutMs: 30_000, headersTimeoutMs: 10_000, keepAliveTimeoutMs: 5000 })
  t.match(loadConfig({ HOOKQ_REQUEST_TIMEOUT_MS: '2000' }), { requestTimeoutMs: 2000, headersTimeoutMs: 2000 }, 'headers default to at most the request timeout')
})

t.test('bad values are refused with the variable named', async (t) => {
  const bad: [Record<string, string>, RegExp][] = [
    [{ PORT: 'eighty' }, /PORT must be a whole number from 0 to 65535, got "eighty"/],
    [{ PORT: '70000' }, /PORT must be a whole number/],
    [{ DATABASE_URL: 'mysql://x' }, /DATABASE_URL must be a postgresql:\/\/ URL/],
    [{ LOG_LEVEL: 'loud' }, /LOG_LEVEL must be one of/],
    [{ HOOKQ_MAX_MESSAGE_BYTES: '2000000', HOOKQ_MAX_REQUEST_BYTES: '1000000' }, /must not exceed HOOKQ_MAX_REQUEST_BYTES/],
    [{ HOOKQ_DB_POOL_SIZE: '0' }, /HOOKQ_DB_POOL_SIZE/],
    [{ DATABASE_URL: 'postgresql://u@h/db?schema=hq' }, /DATABASE_URL names schema "hq": hookq keeps its tables in the public schema/],
    [{ HOOKQ_ADVERTISE_URL: 'ftp://x' }, /HOOKQ_ADVERTISE_URL must be an http:\/\/ or https:\/\/ base URL/],
    [{ HOOKQ_ADVERTISE_URL: 'http://10.0.0.5:8080/hookq' }, /HOOKQ_ADVERTISE_URL must be/],
    [{ HOOKQ_LEADER_POLL_MS: '10' }, /HOOKQ_LEADER_POLL_MS must be a whole number from 50/],
    [{ HOOKQ_LOG_REQUESTS: 'sometimes' }, /HOOKQ_LOG_REQUESTS must be true or false, got "sometimes"/],
    [{ HOOKQ_PUSH_WINDOW_MAX: '0' }, /HOOKQ_PUSH_WINDOW_MAX must be a whole number from 1/],
    [{ HOOKQ_PUSH_ALLOW_PRIVATE: 'maybe' }, /HOOKQ_PUSH_ALLOW_PRIVATE must be true or false/],
    [{ HOOKQ_REQUEST_TIMEOUT_MS: '0' }, /HOOKQ_REQUEST_TIMEOUT_MS must be a whole number from 100 to 3600000, got 0/],
    [{ HOOKQ_HEADERS_TIMEOUT_MS: '10s' }, /HOOKQ_HEADERS_TIMEOUT_MS must be a whole number from 100/],
    [{ HOOKQ_KEEP_ALIVE_TIMEOUT_MS: '-1' }, /HOOKQ_KEEP_ALIVE_TIMEOUT_MS must be a whole number from 100/],
    [{ HOOKQ_REQUEST_TIMEOUT_MS: '1000', HOOKQ_HEADERS_TIMEOUT_MS: '2000' }, /HOOKQ_HEADERS_TIMEOUT_MS \(2000\) must not exceed HOOKQ_REQUEST_TIMEOUT_MS \(1000\)/],
  ]
  for (const [env, message] of bad) t.throws(() => loadConfig(env), { name: 'ConfigError', message }, JSON.stringify(env))
  t.ok(new ConfigError('x') instanceof Error)
  t.same(loadConfig({ HOOKQ_API_KEYS: ' a, b ,,' }).apiKeys, [{ key: 'a', scopes: ['admin'] }, { key: 'b', scopes: ['admin'] }])
})

t.test('the broker refuses to start on a bad value, saying why, with exit code 2', async (t) => {
  const { code, output } = await runBrokerToExit({ PORT: 'eighty' })
  t.equal(code, 2)
  t.match(output, /hookq: configuration error: PORT must be a whole number from 0 to 65535, got "eighty"/)
  const timeout = await runBrokerToExit({ HOOKQ_KEEP_ALIVE_TIMEOUT_MS: 'forever' })
  t.equal(timeout.code, 2)
  t.match(timeout.output, /hookq: configuration error: HOOKQ_KEEP_ALIVE_TIMEOUT_MS must be a whole number/)
})
