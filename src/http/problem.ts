/**
 * One error handler for the whole API: HookqError, Fastify's own errors (validation, body size,
 * content type, JSON syntax) and database outages become RFC 9457 problem details. Anything else is
 * a 500 whose internals stay in the log.
 */
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { ERRORS, HookqError, problemType, type ErrorCode } from '../core/errors.ts'
import { isDatabaseUnavailable } from '../core/database-errors.ts'

interface Problem {
  type: string
  title: string
  status: number
  detail: string
  code: string
  [extra: string]: unknown
}

function problemOf(code: ErrorCode, detail: string, extra?: Record<string, unknown>): Problem {
  const { status, title } = ERRORS[code]
  return { type: problemType(code), title, status, detail, code, ...extra }
}

/** Fastify's validation errors as {path, message} pairs a client can show next to a field. */
function validationErrors(err: FastifyError): { path: string; message: string }[] {
  return (err.validation ?? []).map((v) => ({
    path: `${err.validationContext ?? 'body'}${v.instancePath || ''}`,
    message: withMemberName(v),
  }))
}

/** Ajv's message, naming the member it refused where it knows it (an unknown member, say `__proto__`). */
function withMemberName(v: { keyword?: string; message?: string; params?: Record<string, unknown> }): string {
  const message = v.message ?? 'is invalid'
  const name = v.keyword === 'additionalProperties' ? v.params?.additionalProperty : undefined
  return typeof name === 'string' ? `${message}: ${JSON.stringify(name)}` : message
}

function classify(err: FastifyError): { problem: Problem; retryAfterS?: number } {
  if (err instanceof HookqError) {
    return { problem: problemOf(err.code, err.message, err.extra), retryAfterS: err.retryAfterS }
  }
  if (err.validation) {
    const errors = validationErrors(err)
    const detail = errors.map((e) => `${e.path} ${e.message}`).join('; ')
    return { problem: problemOf('invalid_request', detail, { errors }) }
  }
  switch (err.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return { problem: problemOf('body_too_large', err.message) }
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return { problem: problemOf('unsupported_media_type', 'send application/json') }
    case 'FST_CP_ERR_INVALID_CONTENT_ENCODING':
      return { problem: problemOf('unsupported_media_type', `${err.message}; send gzip, deflate, br or identity`) }
    case 'FST_CP_ERR_INVALID_CONTENT':
      return { problem: problemOf('invalid_json', 'the body could not be decompressed with its Content-Encoding') }
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return { problem: problemOf('invalid_json', 'the body is empty') }
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return { problem: problemOf('invalid_json', err.message) }
  }
  if (err instanceof SyntaxError || (err as { statusCode?: number }).statusCode === 400) {
    return { problem: problemOf('invalid_json', err.message) }
  }
  // A plugin's own client error (the console's static files refuse a path with `..` as 403): the
  // caller asked for something that is not there, not a broker fault worth an error log line.
  const statusCode = (err as { statusCode?: number }).statusCode
  if (statusCode === 403 || statusCode === 404) return { problem: problemOf('route_not_found', 'no such file or route') }
  if (isDatabaseUnavailable(err)) {
    return { problem: problemOf('unavailable', 'the database is unavailable; retry later'), retryAfterS: 1 }
  }
  return { problem: problemOf('internal', 'an internal error occurred; it has been logged') }
}

/** Sends a problem document (pre-serialised, so no response schema can reshape it). */
export function sendProblem(reply: FastifyReply, problem: Problem, retryAfterS?: number): FastifyReply {
  if (retryAfterS !== undefined) reply.header('retry-after', String(retryAfterS))
  return reply.code(problem.status).type('application/problem+json').send(JSON.stringify(problem))
}

/** Installs the error and not-found handlers. */
export function installProblemHandlers(app: FastifyInstance): void {
  app.setErrorHandler((err: FastifyError, request: FastifyRequest, reply: FastifyReply) => {
    const { problem, retryAfterS } = classify(err)
    // Shedding must stay cheap when the broker is overloaded: no log line per refused call at the
    // default level (the metrics and the caller's Retry-After tell the story).
    if (problem.code === 'overloaded' || problem.code === 'rate_limited' || problem.code === 'too_many_pulls')
      request.log.debug({ code: problem.code }, 'request shed')
    else if (problem.code === 'unavailable')
      request.log.warn({ code: problem.code, detail: problem.detail, err: String(err) }, 'request refused: 503 unavailable')
    else if (problem.status >= 500) request.log.error({ err }, 'request failed')
    else request.log.info({ code: problem.code, detail: problem.detail }, 'request rejected')
    return sendProblem(reply, problem, retryAfterS)
  })
  // A path some route serves under other methods is a 405 with Allow, not a 404. Like a 404, it is
  // answered before authentication (the auth hook skips unmatched requests): the paths and their
  // methods are public in /openapi.json anyway.
  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split('?')[0]!
    const allowed = allowedMethods(app, request.url)
    // A route of this very method that answered "not found" itself (a static file that is not
    // there, under the console's wildcard) is a 404: only a method no route takes is a 405.
    if (allowed.length > 0 && !allowed.includes(request.method)) {
      reply.header('allow', allowed.join(', '))
      return sendProblem(reply, problemOf('method_not_allowed', `${request.method} is not allowed on ${path}; use ${allowed.join(', ')}`))
    }
    return sendProblem(reply, problemOf('route_not_found', `no route ${request.method} ${path}`))
  })
}

/**
 * The methods some route takes for this URL, sorted (HEAD included where Fastify exposes it for a
 * GET route). Asks the router itself, so params, wildcards and prefixes match as they do for routing.
 *
 * For a URL that would only match with a param past maxParamLength, the router answers with a
 * stand-in route (the 414 handler), a new closure on every lookup; every real route shares one
 * handler. So a method counts only when two lookups give the same handler.
 */
function allowedMethods(app: FastifyInstance, url: string): string[] {
  return app.supportedMethods
    .filter((method) => {
      const route = app.findRoute({ method, url })
      return route !== null && route.handler === app.findRoute({ method, url })?.handler
    })
    .sort()
}
