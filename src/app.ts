/**
 * buildApp: the HTTP surface, assembled in order (ecosystem plugins, validation, error handling,
 * auth, routes). It never listens; server.ts does, and tests use inject() or listen on port 0.
 */
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify'
import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { Services } from './service/services.ts'
import { installAuth } from './http/auth.ts'
import { HookqError } from './core/errors.ts'
import { installJsonParser } from './http/json-body.ts'
import type { ApiKey } from './http/scopes.ts'
import { installProblemHandlers, sendProblem } from './http/problem.ts'
import { drainUnreadBody } from './http/unread-body.ts'
import { ERRORS, problemType } from './core/errors.ts'
import compress from '@fastify/compress'
import { ackRoutes } from './http/routes/acks.ts'
import { consoleRoutes } from './http/routes/console.ts'
import { installForwarding, type PartitionDirectory } from './http/forward.ts'
import { groupRoutes } from './http/routes/groups.ts'
import { keyRoutes } from './http/routes/keys.ts'
import { healthRoutes } from './http/routes/health.ts'
import { jwksRoutes } from './http/routes/jwks.ts'
import { messageRoutes } from './http/routes/messages.ts'
import { metricsRoutes } from './http/routes/metrics.ts'
import { operationRoutes } from './http/routes/operations.ts'
import { topicRoutes } from './http/routes/topics.ts'
import { scheduleRoutes } from './http/routes/schedules.ts'
import { sharedSchemas } from './http/schemas/common.ts'
import { keySchemas } from './http/schemas/keys.ts'
import { healthSchemas } from './http/schemas/health.ts'
import { groupSchemas } from './http/schemas/groups.ts'
import { ackSchemas } from './http/schemas/acks.ts'
import { messageSchemas } from './http/schemas/messages.ts'
import { operationSchemas } from './http/schemas/operations.ts'
import { topicSchemas } from './http/schemas/topics.ts'
import { scheduleSchemas } from './http/schemas/schedules.ts'
import { LazyCompiles, lazySerializerFactory } from './http/lazy-compile.ts'
import { validatorCompiler } from './http/validation.ts'

export interface AppOptions {
  services: Services
  maxRequestBytes: number
  /** Bearer keys (plain strings are admin keys); none means the API is open. */
  apiKeys?: (ApiKey | string)[]
  /** Requests a second per key (per client IP without keys); 0 or unset means no limit. */
  rateLimitPerS?: number
  /** GET /metrics needs no key even when keys are configured (HOOKQ_METRICS_OPEN). */
  metricsOpen?: boolean
  /** A pino logger; none means no logs. */
  logger?: FastifyBaseLogger
  /** Where the broker process that pushes is, for the calls only it can serve; unset: this process alone. */
  owners?: PartitionDirectory
  /** Log every request and response at info (off by default: a line per call costs a broker a lot). */
  logRequests?: boolean
  /** Server timeouts, ms (see config.ts): a whole request, its headers, an idle keep-alive connection. */
  timeouts?: { requestMs: number; headersMs: number; keepAliveMs: number }
}

const DEFAULT_TIMEOUTS = { requestMs: 30_000, headersMs: 10_000, keepAliveMs: 5000 }

const MiB = 1024 * 1024
/** How long the rest of a refused body may take to arrive (64 MiB at ~20 Mbit/s). */
const UNREAD_BODY_MAX_MS = 30_000

const ALL_SCHEMAS = [
  ...sharedSchemas,
  ...topicSchemas,
  ...messageSchemas,
  ...groupSchemas,
  ...ackSchemas,
  ...operationSchemas,
  ...healthSchemas,
  ...keySchemas,
  ...scheduleSchemas,
]

export const API_INFO = {
  title: 'hookq',
  version: '1.0.0',
  description:
    'HTTP message broker with webhook push delivery, on PostgreSQL. ' +
    'No string in a request may contain NUL (U+0000), but message values and header values (stored as JSON text); ' +
    'integers in paths and query strings are plain decimal digits.',
}

/** The Content-Security-Policy of every /docs answer. */
export const DOCS_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "font-src 'self' data:",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
  "object-src 'none'",
].join('; ')

const lazyCompiles = new WeakMap<FastifyInstance, LazyCompiles>()

/**
 * Compiles every validator and serializer of a ready app that no call has compiled yet (tests: a
 * schema that does not compile fails there, as it failed at start-up before compiles were lazy).
 * Returns how many there are in all.
 */
export function compileAllSchemas(app: FastifyInstance): number {
  return lazyCompiles.get(app)?.compileAll() ?? 0
}

/** How many of the app's validators and serializers have been compiled so far. */
export function compiledSchemas(app: FastifyInstance): number {
  return lazyCompiles.get(app)?.compiled ?? 0
}

/** Builds the Fastify app with every route; call ready() or listen() on it. */
export async function buildApp(opts: AppOptions): Promise<FastifyInstance> {
  const timeouts = opts.timeouts ?? DEFAULT_TIMEOUTS
  const compiles = new LazyCompiles()
  const app = Fastify({
    // Validators and serializers are compiled at a route's first call (src/http/lazy-compile.ts says why).
    schemaController: { compilersFactory: { buildSerializer: lazySerializerFactory(compiles) } },
    // A request (headers and body) that takes longer gets 408 and its connection is closed; so does
    // one whose headers take longer (a connection that sends nothing included). Node checks both
    // every connectionsCheckingInterval (30 s by default, longer than the timeouts themselves).
    // These live on app.server, so connections a HOOKQ_PROCESSES broker process hands it from its
    // own loopback port (server.ts) get them too.
    requestTimeout: timeouts.requestMs,
    keepAliveTimeout: timeouts.keepAliveMs,
    http: {
      headersTimeout: timeouts.headersMs,
      requestTimeout: timeouts.requestMs,
      keepAliveTimeout: timeouts.keepAliveMs,
      connectionsCheckingInterval: Math.max(25, Math.min(1000, Math.floor(timeouts.headersMs / 4))),
    },
    ...(opts.logger ? { loggerInstance: opts.logger } : { logger: false }),
    logController: new LogController({ disableRequestLogging: opts.logRequests !== true }),
    bodyLimit: opts.maxRequestBytes,
    // Idle keep-alive sockets are closed at shutdown so close() does not wait on them.
    forceCloseConnections: 'idle',
    return503OnClosing: true,
    routerOptions: { maxParamLength: 300 },
    // Errors the router raises before any route runs (a param past maxParamLength, a malformed
    // URL) become problem documents too.
    frameworkErrors: (err, _req, reply) => {
      const code = (err as { code?: string }).code === 'FST_ERR_MAX_PARAM_LENGTH' ? 'uri_too_long' : 'invalid_request'
      return sendProblem(reply, {
        type: problemType(code),
        title: ERRORS[code].title,
        status: ERRORS[code].status,
        detail: err.message,
        code,
      })
    },
  })

  // Only JSON bodies: without this, Fastify's default text/plain parser would hand a string to
  // validation (a 400) instead of refusing the media type (415).
  app.removeContentTypeParser('text/plain')
  // JSON bodies nested past MAX_BODY_DEPTH are refused by a linear scan before JSON.parse builds them.
  installJsonParser(app)
  for (const schema of ALL_SCHEMAS) app.addSchema(schema)
  app.setValidatorCompiler(validatorCompiler(ALL_SCHEMAS, compiles))
  lazyCompiles.set(app, compiles)

  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: API_INFO,
      tags: [
        { name: 'topics', description: 'Partitioned topics' },
        { name: 'messages', description: 'Produce and fetch' },
        { name: 'groups', description: 'Consumer groups and their webhook consumers' },
        { name: 'acks', description: 'Acknowledging pushed messages' },
        { name: 'operations', description: 'Seek, the delivery log, health and metrics' },
        { name: 'keys', description: 'API keys scoped to topics and groups' },
        { name: 'schedules', description: 'Messages produced on a cron or interval schedule' },
      ],
      components: { securitySchemes: { apiKey: { type: 'http', scheme: 'bearer' } } },
      security: [{ apiKey: [] }],
    },
    // Name components after the schemas' $id (Topic, Problem, ...) instead of def-0, def-1.
    refResolver: { buildLocalReference: (json, _baseUri, _fragment, i) => (json.$id as string | undefined) ?? `def-${i}` },
  })
  // Swagger UI gets a Content-Security-Policy like the console's (routes/console.ts), but for inline
  // styles, which its React components set; its scripts are files of this origin, its one fetch the
  // document at /docs/json. No validator badge: that would load an image from validator.swagger.io.
  await app.register(swaggerUi, { routePrefix: '/docs', staticCSP: DOCS_CSP, uiConfig: { validatorUrl: null } })
  // Compressed request bodies (a producer gzipping a big batch): bodyLimit counts the decompressed
  // bytes, so a small gzip bomb is a 413, never a big buffer. Answers are not compressed: they are
  // small, and a proxy in front does that better than the broker's single thread.
  await app.register(compress, {
    globalCompression: false,
    globalDecompression: true,
    requestEncodings: ['gzip', 'deflate', 'br', 'identity'],
  })

  // At shutdown, idle keep-alive connections are closed at once (forceCloseConnections); busy ones
  // get `connection: close` on their last response, or close() would wait out their keep-alive.
  let closing = false
  app.addHook('preClose', async () => {
    closing = true
  })
  // An answer sent before the body was read (413, 401, ...) is read by the client only if the
  // broker keeps reading too: the rest of the body is thrown away, within bounds (unread-body.ts).
  // One hook for both: it runs on every answer, produce and acks included.
  const unread = { maxBytes: Math.max(64 * MiB, 2 * opts.maxRequestBytes), maxMs: UNREAD_BODY_MAX_MS }
  // Callback hooks, not async ones, here and below: they run on every call, and an async hook costs a promise each.
  app.addHook('onSend', (req, reply, payload, done) => {
    if (closing) reply.header('connection', 'close')
    else drainUnreadBody(req, reply, unread)
    done(null, payload)
  })

  installProblemHandlers(app)
  // Only origin-form targets (`/v1/...`): the router also takes absolute-form ones
  // (`POST http://host/v1/...`), and a target naming a host must never reach code that builds a URL
  // from it (a forwarded ack would go to that host).
  app.addHook('onRequest', (req, _reply, done) => {
    if (req.raw.url?.startsWith('/')) return done()
    done(new HookqError('invalid_request', 'the request target must be a path (origin-form, RFC 9112 §3.2.1)'))
  })
  installAuth(app, {
    keys: opts.apiKeys ?? [],
    stored: { lookup: (key) => opts.services.keys.lookupFresh(key) },
    groupTopics: (group) => opts.services.groups.topicsOf(group),
    groupNamedTopics: (group) => opts.services.groups.namedTopicsOf(group),
    scheduleTopic: (name) => opts.services.schedules.topicOf(name),
    rateLimitPerS: opts.rateLimitPerS ?? 0,
    metricsOpen: opts.metricsOpen ?? false,
  })
  installForwarding(app, opts.owners)

  await app.register(healthRoutes(opts.services))
  await app.register(jwksRoutes(opts.services))
  await app.register(topicRoutes(opts.services))
  await app.register(messageRoutes(opts.services))
  await app.register(groupRoutes(opts.services))
  await app.register(ackRoutes(opts.services))
  await app.register(operationRoutes(opts.services))
  await app.register(scheduleRoutes(opts.services))
  await app.register(metricsRoutes(opts.services))
  await app.register(keyRoutes(opts.services, (opts.apiKeys ?? []).length > 0))
  await app.register(consoleRoutes())
  app.get('/openapi.json', { config: { access: { on: 'open' } }, schema: { hide: true } }, async () => app.swagger())
  return app
}
